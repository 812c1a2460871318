package upstream

import (
	"net"
)

// watchedConn is a connection to an instance that refuses, as it reads
// them, the answers whose status fasthttp's client takes but must not
// keep the connection after: 101 Switching Protocols, after which the
// connection no longer speaks HTTP, and a status outside 100-599 (fasthttp
// reads any three digits, "000" as 200). fasthttp decides to keep a
// connection inside Do, on the answer's Connection header alone: kept
// after a 101, it handed the next request the bytes the instance sent
// after it as that request's answer, and a "000" was relayed as a 200
// that no service sent. Refused here, the read fails, fasthttp closes the
// connection, and Do's error is a bad response (a 502).
//
// Only the status lines are read, as they pass: a few bytes of each
// answer, then nothing until the next request is written. Plain
// connections alone: fasthttp puts TLS over the connection Dial returns.
type watchedConn struct {
	net.Conn
	head statusScan
	// refused is the answer refused, once one was: every read after the
	// one that found it fails with it.
	refused error
}

// watch returns c with its answers' statuses watched.
func watch(c net.Conn) *watchedConn { return &watchedConn{Conn: c} }

// Write writes a request's bytes: the next bytes read are its answer.
func (c *watchedConn) Write(p []byte) (int, error) {
	c.head.expectAnswer()
	return c.Conn.Write(p)
}

// Read reads, and fails once it has read the status of an answer to
// refuse. The bytes before the status's last digit are returned first, so
// that fasthttp holds part of a status line it cannot complete, and reads
// the failure as an answer broken off in its head (had it no byte, it
// would take the failure for a connection closed before any answer, and
// send a GET again).
func (c *watchedConn) Read(p []byte) (int, error) {
	if c.refused != nil {
		return 0, c.refused
	}
	n, err := c.Conn.Read(p)
	if c.head.state == scanDone {
		return n, err
	}
	at, refused := c.head.scan(p[:n])
	if !refused {
		return n, err
	}
	c.refused = refusedStatusError(c.head.status)
	if at > 0 {
		return at, nil
	}
	return 0, c.refused
}

// refusedStatusError is the status of an answer watchedConn refused.
type refusedStatusError [3]byte

func (e refusedStatusError) Error() string {
	if string(e[:]) == "101" {
		return "the instance answered 101 Switching Protocols: the connection no longer speaks HTTP"
	}
	return "the instance answered status " + string(e[:]) + ", outside HTTP's 100-599"
}

// statusScan follows the start of the answers to one request, byte by
// byte, as fasthttp's client reads them: blank lines skipped, the
// protocol up to a space, spaces, three digits; past an interim answer
// (1xx but 101) to the blank line that ends its head, and the next
// answer's status.
type statusScan struct {
	state  scanState
	digits int // of status, seen so far
	status [3]byte
	// lineBytes counts the bytes other than CR of an interim head's
	// current line: a line without any ends the head.
	lineBytes int
}

type scanState uint8

const (
	scanDone        scanState = iota // the status is one to take, or one fasthttp refuses itself
	scanLineStart                    // before a status line
	scanProtocol                     // in its protocol
	scanSpaces                       // after the protocol
	scanStatus                       // in the status
	scanInterimHead                  // in an interim answer's head
)

func (s *statusScan) expectAnswer() { s.state = scanLineStart }

// scan follows b, the next bytes read, and reports whether they end the
// status of an answer to refuse, at b[at].
func (s *statusScan) scan(b []byte) (at int, refused bool) {
	start := 0
	if s.state == scanLineStart && len(b) > 9 && b[8] == ' ' && b[9] != ' ' && string(b[:5]) == "HTTP/" {
		// Most answers' reads start with their status line: straight to
		// the status, after the protocol "HTTP/d.d" (fasthttp takes no
		// other), rather than through the protocol a byte at a time.
		s.state, s.digits, start = scanStatus, 0, 9
	}
	for i := start; i < len(b); i++ {
		ch := b[i]
		switch s.state {
		case scanDone:
			return 0, false
		case scanLineStart:
			if ch != '\r' && ch != '\n' {
				s.state = scanProtocol
			}
		case scanProtocol:
			switch ch {
			case ' ':
				s.state = scanSpaces
			case '\n': // no status: fasthttp's to refuse
				s.state = scanDone
			}
		case scanSpaces:
			if ch != ' ' {
				s.state, s.digits = scanStatus, 0
				if s.statusByte(ch) {
					return i, true
				}
			}
		case scanStatus:
			if s.statusByte(ch) {
				return i, true
			}
		case scanInterimHead:
			switch ch {
			case '\n':
				if s.lineBytes == 0 {
					s.state = scanLineStart
				}
				s.lineBytes = 0
			case '\r':
			default:
				s.lineBytes++
			}
		}
	}
	return 0, false
}

// statusByte takes ch, a byte of the status, and reports whether it ends
// one to refuse.
func (s *statusScan) statusByte(ch byte) (refused bool) {
	if ch < '0' || ch > '9' { // not three digits: fasthttp's to refuse
		s.state = scanDone
		return false
	}
	s.status[s.digits] = ch
	if s.digits++; s.digits < len(s.status) {
		return false
	}
	code := int(s.status[0]-'0')*100 + int(s.status[1]-'0')*10 + int(s.status[2]-'0')
	switch {
	case code == 101 || code < 100 || code > 599:
		return true
	case code < 200: // interim: another answer follows its head
		s.state, s.lineBytes = scanInterimHead, len(s.status)
	default:
		s.state = scanDone
	}
	return false
}
