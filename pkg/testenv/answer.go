package testenv

import (
	"encoding/json"
	"net/http"

	"github.com/coinexport/export/pkg/envelope"
)

// Answer is what a call a test sent in the background got: its status and
// envelope, or the error that stopped it (a connection cut off).
type Answer struct {
	Status int
	Body   envelope.Parsed
	Err    error
}

// AnswerLater runs send in a goroutine and delivers its answer, so that a
// test can stop or hold up the binary under test while the call is in
// flight (a drain, a lock wait) and then see how it ended.
func AnswerLater(send func() (*http.Response, error)) <-chan Answer {
	answered := make(chan Answer, 1)
	go func() {
		resp, err := send()
		if err != nil {
			answered <- Answer{Err: err}
			return
		}
		defer resp.Body.Close()
		var body envelope.Parsed
		err = json.NewDecoder(resp.Body).Decode(&body)
		answered <- Answer{Status: resp.StatusCode, Body: body, Err: err}
	}()
	return answered
}
