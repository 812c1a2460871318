package edge

import (
	"syscall"

	"github.com/coinexport/export/gateway/lingerclose"
)

// otherDescriptors allows for the file descriptors the gateway holds
// besides client, upstream and Redis pool connections: its two listeners
// and the admin one's scrapes, stdin/out/err, the key store's PostgreSQL
// pool (keyStorePoolSize) and revocation listener, go-redis' pipeline pool
// (10), the collector's connection, the runtime's poller.
const otherDescriptors = 64

// roomForClients is how many client connections a file descriptor limit
// leaves room for: the limit less what the gateway may hold besides them,
// the connections lingering at their close (ordinary and refused), the
// refusals waiting for their request, its upstream connections
// (UPSTREAM_MAX_CONNS and a health probe's to each instance of the *_URLS:
// the replicas UPSTREAM_RESOLVE_INTERVAL finds behind a name later are not
// known at start), the Redis client's pool (go-redis: 10 per GOMAXPROCS
// unless REDIS_URL says pool_size, so 640 on a node of 64 CPUs) and
// otherDescriptors; 0 if none.
func roomForClients(limit uint64, cfg Config, linger lingerclose.Options, redisPool int) uint64 {
	instances := len(cfg.ExportReaderURLs) + len(cfg.SalesWriterURLs) + len(cfg.ShopSchemaURLs)
	besides := uint64(linger.MaxConns) + maxRefusalsLingering + maxRefusalsWaiting + otherDescriptors +
		uint64(cfg.UpstreamMaxConns+1)*uint64(instances) + uint64(redisPool)
	if limit <= besides {
		return 0
	}
	return limit - besides
}

// warnCapPastDescriptors says at start when GATEWAY_MAX_CONNECTIONS is
// more than the process's descriptor limit leaves room for. The cap may
// then never be reached: at the limit accepts fail (acceptretry), and new
// connections wait unanswered in the kernel's backlog instead of being
// refused the 503 envelope, with no gateway_connections_refused_total for
// ExportGatewayConnectionsRefused to see (a gateway at 1,024 descriptors
// and the default 4,096: 491 of 1,500 connections had no answer in 5 s).
// The limit read is the one in force: the Go runtime raised the soft limit
// to the hard one (less one) at start, whatever `ulimit -n` said.
func (g *Gateway) warnCapPastDescriptors() {
	var limit syscall.Rlimit
	if g.cfg.MaxConnections == 0 || syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit) != nil {
		return
	}
	if room := roomForClients(limit.Cur, g.cfg, g.linger, g.redis.Options().PoolSize); uint64(g.cfg.MaxConnections) > room {
		g.log.Warn("GATEWAY_MAX_CONNECTIONS is more than the file descriptor limit leaves room for: past that many "+
			"connections new ones wait unanswered in the backlog instead of being refused 503; raise nofile or lower the cap",
			"max_connections", g.cfg.MaxConnections, "descriptor_limit", limit.Cur, "room_for_connections", room)
	}
}
