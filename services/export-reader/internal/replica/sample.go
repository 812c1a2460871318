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
// $1 and $2 are the previous reading's mark (a primary's WAL end and the
// time it sent it), NULL without one: whether it is replayed now, and how
// long ago it was sent, by the standby's clock.
const sampleSQL = `SELECT pg_is_in_recovery(),
	coalesce(pg_last_wal_replay_lsn() >= greatest(pg_last_wal_receive_lsn(), w.latest_end_lsn), false),
	extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8,
	w.status,
	w.pid IS NOT NULL AND w.status IS NULL,
	extract(epoch FROM clock_timestamp() - w.last_msg_receipt_time)::float8,
	extract(epoch FROM clock_timestamp() - w.last_msg_send_time)::float8,
	coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false),
	extract(epoch FROM clock_timestamp() - $2::timestamptz)::float8,
	w.latest_end_lsn::text,
	w.last_msg_send_time
FROM (SELECT) AS one LEFT JOIN pg_stat_wal_receiver AS w ON true`

// sample is one row of sampleSQL.
type sample struct {
	recovery       bool     // a standby
	replayedAll    bool     // everything received, and all the primary had when it last sent, is replayed
	sinceReplay    *float64 // seconds since the commit of the last transaction replayed (its primary's stamp)
	receiver       *string  // the WAL receiver's status; nil without one
	receiverHidden bool     // there is one, but the role may not see its state
	silence        *float64 // seconds since the WAL receiver last heard from the primary
	sinceSent      *float64 // seconds since the primary sent the last message heard (its clock)
	// markReplayed: the previous reading's mark is replayed, sent
	// sinceMark seconds ago (nil without a mark).
	markReplayed bool
	sinceMark    *float64
	mark         mark // this reading's, for the next
}

// mark is what a primary's message said: its WAL ended at end when it sent
// the message at sent. Both nil when unknown.
type mark struct {
	end  *string
	sent *time.Time
}

// Why a standby's lag cannot be told; the last reading then ages.
var (
	errNoReceiver     = errors.New("no WAL receiver streaming from the primary (primary down or unreachable, or archive recovery): what it has committed since is unknown")
	errReceiverHidden = errors.New("the role may not read pg_stat_wal_receiver: grant it pg_monitor so that the lag can be measured")
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
//     on the primary's side, which only its WAL end tells. And if what the
//     primary had when it sent the previous reading's last message is
//     replayed by now (the previous mark), a commit not replayed came
//     after that send, so it is younger than that too: WAL passing
//     through a standby that keeps up (an idle primary's checkpoint, a
//     long bulk statement's records, a restart's) reads the time since
//     that send, not the age of the last commit, which on an idle primary
//     is hours (TestAnIdleStandbyReadsNoLag read 9.3 s once, in CI);
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
	lag := max(0, *s.silence)
	if s.sinceSent != nil {
		lag = max(lag, *s.sinceSent)
	}
	if !s.replayedAll {
		if s.sinceReplay == nil {
			return 0, errNoReplay
		}
		behind := *s.sinceReplay
		if s.markReplayed && s.sinceMark != nil {
			behind = min(behind, max(0, *s.sinceMark))
		}
		lag = max(lag, behind)
	}
	return time.Duration(lag * float64(time.Second)), nil
}
