package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	redisOnce sync.Once
	redisURL  string
	redisErr  error
)

// RedisURL returns the URL of a Redis server shared by the tests of this run.
// Tests must keep to key names of their own (KeyPrefix helps).
func RedisURL(t testing.TB) string {
	t.Helper()
	redisOnce.Do(func() {
		if u := os.Getenv("TEST_REDIS_URL"); u != "" {
			redisURL = u
			return
		}
		var srv *RedisServer
		srv, redisErr = startRedis()
		if redisErr == nil {
			redisURL = srv.URL
			atExit(srv.stop)
		}
	})
	if redisErr != nil {
		t.Fatalf("testenv: Redis: %v", redisErr)
	}
	return redisURL
}

// KeyPrefix returns a Redis key prefix unique to this test.
func KeyPrefix(t testing.TB) string {
	return "test:" + randomHex(6) + ":"
}

// RedisServer is a redis-server of one test's own, for tests that stop and
// restart Redis. It listens on a fixed 127.0.0.1 port so it comes back at the
// same address.
type RedisServer struct {
	URL  string
	addr string
	dir  string
	cmd  *exec.Cmd
}

// StartRedis starts a private redis-server that is stopped when the test ends.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	srv, err := startRedis()
	if err != nil {
		t.Fatalf("testenv: Redis: %v", err)
	}
	t.Cleanup(srv.stop)
	return srv
}

func startRedis() (*RedisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not found: install it (apt-get install -y redis-server)")
	}
	dir, err := os.MkdirTemp("", "testenv-redis-")
	if err != nil {
		return nil, err
	}
	// Below the ephemeral range (freeAddr), where no other process takes
	// the port before redis-server listens, or while a test has it stopped.
	addr, err := freeAddr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	srv := &RedisServer{URL: "redis://" + addr + "/0", addr: addr, dir: dir}
	if err := srv.Start(); err != nil {
		// Its log stays for the error to point at; the folder holds nothing else.
		return nil, err
	}
	return srv, nil
}

// Start (re)starts the server at its address.
func (s *RedisServer) Start() error {
	_, port, _ := net.SplitHostPort(s.addr)
	s.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port,
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--logfile", filepath.Join(s.dir, "log"))
	// Killed with the test binary, also one killed before its cleanups
	// ran: it served on, orphaned, on its port (TestRedisServerDiesWithItsTest).
	DiesWithTest(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	// The server that answers must be this one: where another test
	// binary's took the port first, this one exits, and a ping alone would
	// pass against the other, which this test's pauses and stops then hit.
	pid := s.cmd.Process.Pid
	ours := fmt.Sprintf("process_id:%d\r\n", pid)
	client := redis.NewClient(&redis.Options{Addr: s.addr})
	defer client.Close()
	if !waitFor(5*time.Second, func() bool {
		info, err := client.Info(context.Background(), "server").Result()
		return err == nil && strings.Contains(info, ours)
	}) {
		s.Stop()
		return fmt.Errorf("redis-server (pid %d) did not answer on %s; its log: %s", pid, s.addr, filepath.Join(s.dir, "log"))
	}
	return nil
}

// Stop kills the server, as an outage would.
func (s *RedisServer) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_, _ = s.cmd.Process.Wait()
	s.cmd = nil
}

func (s *RedisServer) stop() {
	s.Stop()
	os.RemoveAll(s.dir)
}
