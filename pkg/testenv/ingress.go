package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Nginx runs Debian's nginx for the test's length with http, the inside
// of its http block (upstream and server blocks: the README's snippet),
// and waits until it listens on listen, an address the caller wrote into
// http. Its main configuration is the test's: one process (no master: a
// worker left by a master killed with the test serves on, orphaned), no
// daemon, its logs, pid and temporary files in a folder of its own. Its
// error log is given to the test when it fails.
func Nginx(t testing.TB, listen, http string) {
	t.Helper()
	bin := ingressBinary(t, "nginx")
	dir := ingressDir(t, "nginx")
	conf := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 512; }
http {
  access_log %[1]s/access.log;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, http)
	path := filepath.Join(dir, "nginx.conf")
	writeIngressFile(t, path, conf)
	// -e: nginx opens its compiled-in error log (/var/log/nginx) before
	// it reads the configuration; -p: relative paths stay in dir.
	startIngress(t, listen, dir, "error.log", exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", path))
}

// HAProxy runs Debian's haproxy for the test's length with cfg (its
// defaults, frontend and backend sections: the README's snippet) in the
// foreground, and waits until it listens on listen, an address the
// caller wrote into cfg.
func HAProxy(t testing.TB, listen, cfg string) {
	t.Helper()
	bin := ingressBinary(t, "haproxy")
	dir := ingressDir(t, "haproxy")
	path := filepath.Join(dir, "haproxy.cfg")
	writeIngressFile(t, path, strings.TrimSuffix(cfg, "\n")+"\n") // haproxy refuses a last line without one
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("testenv: haproxy refuses the configuration: %v\n%s\n%s", err, out, cfg)
	}
	startIngress(t, listen, dir, "", exec.Command(bin, "-db", "-f", path))
}

// RequireIngressVariable, set to 1, makes a test that needs nginx or
// haproxy fail when the binary is missing, where it is otherwise skipped:
// .ci/run installs both and then sets it, so that a CI run that has them
// never passes with the test skipped.
const RequireIngressVariable = "REQUIRE_INGRESS"

// NeedIngress skips the test, or fails it under REQUIRE_INGRESS=1, unless
// both nginx and haproxy are installed: called first, before the test
// starts what it would run them in front of.
func NeedIngress(t testing.TB) {
	t.Helper()
	ingressBinary(t, "nginx")
	ingressBinary(t, "haproxy")
}

// ingressBinary finds name on PATH or in /usr/sbin (Debian's place, not on
// a non-root user's PATH); without it the test is skipped, or fails under
// REQUIRE_INGRESS=1.
func ingressBinary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join("/usr/sbin", name); isExecutable(p) {
		return p
	}
	msg := fmt.Sprintf("testenv: %s is not installed (apt-get install nginx haproxy): the README's ingress set-ups are not tested", name)
	if os.Getenv(RequireIngressVariable) == "1" {
		t.Fatal(msg + ", and " + RequireIngressVariable + "=1")
	}
	t.Skip(msg)
	return ""
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

// ingressDir is a folder removed when the test ends, owned by the user the
// proxy runs as (ingressUser).
func ingressDir(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "testenv-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred := ingressUser(t); cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func writeIngressFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ingressUser is who the proxies run as when the test runs as root: the
// database server's unprivileged user, as PgBouncer does. nginx started as
// root would hand its worker to "nobody", which cannot reach the test's
// folder; neither needs root to listen above port 1024.
func ingressUser(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("testenv: running as root needs a 'postgres' user to run the proxy: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// startIngress starts cmd in a process group of its own, stops the group
// when the test ends, and waits up to 10 s for listen to accept. The
// process dies with the test binary too (DiesWithTest): its own group
// keeps it from a terminal's SIGINT. logFile, in dir, is shown with its
// output on failure.
func startIngress(t testing.TB, listen, dir, logFile string, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: ingressUser(t)}
	DiesWithTest(cmd)
	var out Output
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", cmd.Path, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	logs := func() string {
		if logFile == "" {
			return out.String()
		}
		b, _ := os.ReadFile(filepath.Join(dir, logFile))
		return out.String() + string(b)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("%s's output:\n%s", filepath.Base(cmd.Path), logs())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", listen); err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			t.Fatalf("testenv: %s exited: %s", filepath.Base(cmd.Path), strings.TrimSpace(logs()))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s did not listen on %s within 10 s: %s", filepath.Base(cmd.Path), listen, strings.TrimSpace(logs()))
		}
	}
}
