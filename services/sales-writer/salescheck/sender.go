package salescheck

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coinexport/export/pkg/envelope"
	"github.com/coinexport/export/pkg/saleclaim"
)

// HTTPSender sends calls to the API at base (".../v1"): sales with the
// sales:write key of their platform (saleKeys), reads with readKey.
func HTTPSender(client *http.Client, base string, saleKeys map[string]string, readKey string) Sender {
	return func(ctx context.Context, in Input) Output {
		req, err := newRequest(ctx, base, saleKeys, readKey, in)
		if err != nil {
			return Output{Unknown: true, RequestID: err.Error()}
		}
		resp, err := client.Do(req)
		if err != nil {
			return Output{Unknown: true, RequestID: err.Error()}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return Output{Unknown: true, Status: resp.StatusCode, RequestID: err.Error()}
		}
		return parseAnswer(in, resp.StatusCode, body)
	}
}

func newRequest(ctx context.Context, base string, saleKeys map[string]string, readKey string, in Input) (*http.Request, error) {
	target := base + "/export/items/" + url.PathEscape(in.Item)
	if in.Op == Read {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
		if err == nil {
			req.Header.Set("X-API-Key", readKey)
		}
		return req, err
	}
	body, _ := json.Marshal(map[string]string{"external_order_id": in.Order})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target+"/sales/"+in.Op, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", in.Key)
	req.Header.Set("X-API-Key", saleKeys[in.Platform])
	return req, nil
}

// parseAnswer reads an answer of status with body. Only a 200, 404 or 409
// tells the outcome of a call; anything else (a 5xx, a 429, an answer that
// is not the envelope) is unknown to the model, and is reported apart
// (Counts). A sale's 5xx that says nothing was applied is marked so
// (SaysNothingApplied).
func parseAnswer(in Input, status int, body []byte) Output {
	var env envelope.Parsed
	out := Output{Status: status}
	if err := json.Unmarshal(body, &env); err != nil {
		out.Unknown, out.RequestID = true, "not an envelope: "+err.Error()
		return out
	}
	out.RequestID = env.Meta.RequestID
	if env.Error != nil {
		out.Code = env.Error.Code
		out.NothingApplied = in.Op != Read && SaysNothingApplied(status, env.Error.Code, env.Error.Message)
	}
	switch {
	case status == http.StatusOK && in.Op == Read:
		out.Unknown = json.Unmarshal(env.Data, &out.View) != nil
	case status == http.StatusOK:
		out.Unknown = json.Unmarshal(env.Data, &out.Result) != nil
	case status == http.StatusNotFound, status == http.StatusConflict:
	default:
		out.Unknown = true
	}
	return out
}

// SaysNothingApplied reports whether a sale's failure answer tells its
// platform that this attempt applied nothing: the writer's and the
// gateway's messages that say so ("… nothing was applied: retry …"), and
// the gateway's 503 upstream_unavailable, which its README documents as
// sent to no instance (its message says only "retry later"). The writer's
// tests hold it to the claim each of its answers records (sale_applied).
func SaysNothingApplied(status int, code, message string) bool {
	if status < http.StatusInternalServerError {
		return false
	}
	return strings.Contains(message, saleclaim.NothingApplied) ||
		status == http.StatusServiceUnavailable && code == "upstream_unavailable"
}
