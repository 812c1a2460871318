package replica

import (
	"errors"
	"time"
)

// sampleSQL reads, in one round trip, what the lag is computed from. On a
// primary only the first column matters. pg_stat_wal_receiver has at most
// one row; its columns other than pid are NULL for a role without
// pg_read_all_stats (pg_monitor has it).
const sampleSQL = `SELECT pg_is_in_recovery(),
	coalesce(pg_last_wal_receive_lsn() <= pg_last_wal_replay_lsn(), false),
	extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,
	w.status,
	w.pid IS NOT NULL AND w.status IS NULL,
	extract(epoch FROM clock_timestamp() - w.last_msg_receipt_time)::float8
FROM (SELECT) AS one LEFT JOIN pg_stat_wal_receiver AS w ON true`

// sample is one row of sampleSQL.
type sample struct {
	recovery       bool     // a standby
	replayedAll    bool     // everything received is replayed
	sinceReplay    *float64 // seconds since the commit of the last transaction replayed (its primary's stamp)
	receiver       *string  // the WAL receiver's status; nil without one
	receiverHidden bool     // there is one, but the role may not see its state
	silence        *float64 // seconds since the WAL receiver last heard from the primary
}

// Why a standby's lag cannot be told; the last reading then ages.
var (
	errNoReceiver     = errors.New("no WAL receiver streaming from the primary (primary down or unreachable, or archive recovery): what it has committed since is unknown")
	errReceiverHidden = errors.New("the role may not read pg_stat_wal_receiver: grant it pg_monitor so that the lag can be measured")
	errNoReplay       = errors.New("WAL received but no transaction replayed since the standby started")
)

// lag is how far the standby is behind, at most: the age of the oldest
// commit it may lack. Two ways to lack one:
//   - received, not replayed: then it committed after the last replayed
//     one, so it is younger than that one's stamp (a lag measured as the
//     age of the last replayed commit alone would grow on a standby of an
//     idle primary, which lacks nothing);
//   - not received: the WAL receiver's last message from the primary (WAL
//     or a keepalive, which a healthy link gets at least every
//     wal_receiver_timeout/2, 30 s by default) brought what was committed
//     before it; a receiver that heard nothing for longer lags that much
//     (a cut link, a stuck primary).
//
// Without a streaming receiver it cannot be told (errNoReceiver).
func (s sample) lag() (time.Duration, error) {
	if !s.recovery {
		return 0, nil
	}
	if s.receiverHidden {
		return 0, errReceiverHidden
	}
	if s.receiver == nil || *s.receiver != "streaming" || s.silence == nil {
		return 0, errNoReceiver
	}
	lag := max(0, *s.silence)
	if !s.replayedAll {
		if s.sinceReplay == nil {
			return 0, errNoReplay
		}
		lag = max(lag, *s.sinceReplay)
	}
	return time.Duration(lag * float64(time.Second)), nil
}
