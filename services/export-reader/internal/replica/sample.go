package replica

import (
	"errors"
	"time"
)

// sampleSQL reads, in one round trip, what the lag is computed from. On a
// primary only the first column matters. pg_stat_wal_receiver has at most
// one row; its columns other than pid are NULL for a role without
// pg_read_all_stats (pg_monitor has it). latest_end_lsn is the end of the
// primary's WAL as its last message said (greatest skips it when NULL).
// A WAL receiver that has just (re)connected shows, until the primary's
// first message, its start time as both send and receipt time, and the
// WAL end the last connection heard: the last column tells a message
// heard from that.
const sampleSQL = `SELECT pg_is_in_recovery(),
	coalesce(pg_last_wal_replay_lsn() >= greatest(pg_last_wal_receive_lsn(), w.latest_end_lsn), false),
	extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,
	w.status,
	w.pid IS NOT NULL AND w.status IS NULL,
	extract(epoch FROM clock_timestamp() - w.last_msg_receipt_time)::float8,
	extract(epoch FROM clock_timestamp() - w.last_msg_send_time)::float8,
	w.last_msg_send_time IS DISTINCT FROM w.last_msg_receipt_time
FROM (SELECT) AS one LEFT JOIN pg_stat_wal_receiver AS w ON true`

// sample is one row of sampleSQL.
type sample struct {
	recovery       bool     // a standby
	replayedAll    bool     // everything received, and all the primary had when it last sent, is replayed
	sinceReplay    *float64 // seconds since the commit of the last transaction replayed (its primary's stamp)
	receiver       *string  // the WAL receiver's status; nil without one
	receiverHidden bool     // there is one, but the role may not see its state
	heard          bool     // the receiver has heard a message since it (re)connected
	silence        *float64 // seconds since the WAL receiver last heard from the primary
	sinceSent      *float64 // seconds since the primary sent the last message heard (its clock)
}

// Why a standby's lag cannot be told; the last reading then ages.
var (
	errNoReceiver     = errors.New("no WAL receiver streaming from the primary (primary down or unreachable, or archive recovery): what it has committed since is unknown")
	errReceiverHidden = errors.New("the role may not read pg_stat_wal_receiver: grant it pg_monitor so that the lag can be measured")
	errNotHeard       = errors.New("the WAL receiver has heard nothing from the primary since it (re)connected: what it has committed since is unknown")
	errNoReplay       = errors.New("WAL received but no transaction replayed since the standby started")
)

// lag is how far the standby is behind, at most: the age of the oldest
// commit it may lack. Two ways to lack one:
//   - not replayed, whether received or still on its way (the primary's
//     last message said its WAL went further than what is replayed): then
//     it committed after the last replayed one, so it is younger than that
//     one's stamp (a lag measured as the age of the last replayed commit
//     alone would grow on a standby of an idle primary, which lacks
//     nothing). A link slower than the primary writes WAL keeps a backlog
//     on the primary's side, which only its WAL end tells;
//   - sent after the last message heard: that message (WAL or a
//     keepalive, which a healthy link gets at least every
//     wal_receiver_timeout/2, 30 s by default) brought what was committed
//     before the primary sent it, so the standby lags by the age of that
//     send, or of its receipt if later by the standby's clock. The receipt
//     alone (a cut link, a stuck primary) missed a link that streams on,
//     every message late: a standby 4 s behind read 0.2 s
//     (TestALinkThatDeliversLateIsLag).
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
	if !s.heard {
		return 0, errNotHeard
	}
	lag := max(0, *s.silence)
	if s.sinceSent != nil {
		lag = max(lag, *s.sinceSent)
	}
	if !s.replayedAll {
		if s.sinceReplay == nil {
			return 0, errNoReplay
		}
		lag = max(lag, *s.sinceReplay)
	}
	return time.Duration(lag * float64(time.Second)), nil
}
