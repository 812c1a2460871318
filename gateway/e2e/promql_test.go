package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// A small PromQL parser: enough of the language to tell which series and
// which labels a dashboard query or an alert rule reads (Prometheus's own
// parser comes with the whole prometheus/prometheus module and its
// requirements, for one test). What it does not know, a syntax or a
// function, is an error, never skipped: a query it cannot read fails the
// check instead of passing it unread.

// node is a parsed expression: one of the *Node types below.
type node any

type (
	numberNode struct{}
	stringNode struct{ value string }
	// selectorNode is a vector selector: metric{label="value", ...}.
	selectorNode struct {
		metric   string
		matchers []string // the label names its matchers name
	}
	// rangeNode is a range selector or a subquery: x[5m], (expr)[5m:1m].
	rangeNode struct{ expr node }
	callNode  struct {
		fn   string
		args []node
	}
	aggregateNode struct {
		op       string
		grouping []string // by (...) or, if without, without (...)
		without  bool
		args     []node
	}
	binaryNode struct {
		op       string
		lhs, rhs node
		matching *matching // nil without on/ignoring
	}
	// matching is a binary operator's on (...) or ignoring (...), with its
	// group_left/group_right (...) if any.
	matching struct {
		on      bool // false: ignoring
		labels  []string
		group   string // "", "left" or "right"
		include []string
	}
)

type tokenKind int

const (
	tokEOF tokenKind = iota
	tokIdent
	tokNumber
	tokDuration
	tokString // text is the value, unquoted
	tokRange  // text is what is between [ and ]
	tokPunct
)

type token struct {
	kind tokenKind
	text string
	pos  int // in the query
}

var (
	durationToken = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+`)
	numberToken   = regexp.MustCompile(`^(0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?)`)
	identToken    = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*`)
	rangeText     = regexp.MustCompile(`^\s*([0-9]+(ms|s|m|h|d|w|y))+\s*(:\s*(([0-9]+(ms|s|m|h|d|w|y))+)?\s*)?$`)
	// Longest first, so that != is not read as ! then =.
	puncts = []string{"!=", "=~", "!~", "==", ">=", "<=", "(", ")", "{", "}", ",", "=", "+", "-", "*", "/", "%", "^", ">", "<", "@"}
)

// lex splits src into tokens.
func lex(src string) ([]token, error) {
	var toks []token
	for rest := src; ; {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if rest == "" {
			return append(toks, token{kind: tokEOF, pos: len(src)}), nil
		}
		tok, n, err := nextToken(rest)
		if err != nil {
			return nil, fmt.Errorf("at %q: %w", rest, err)
		}
		tok.pos = len(src) - len(rest)
		if tok.kind != tokEOF { // a comment
			toks = append(toks, tok)
		}
		rest = rest[n:]
	}
}

// nextToken reads the token src starts with and returns it with its length
// in src; a comment is a tokEOF token.
func nextToken(src string) (token, int, error) {
	switch c := src[0]; {
	case c == '#':
		n := strings.IndexByte(src, '\n')
		if n < 0 {
			n = len(src)
		}
		return token{kind: tokEOF}, n, nil
	case c == '"' || c == '\'' || c == '`':
		return stringAt(src)
	case c == '[':
		end := strings.IndexByte(src, ']')
		if end < 0 || !rangeText.MatchString(src[1:end]) {
			return token{}, 0, fmt.Errorf("a range is [duration] or [duration:step]")
		}
		return token{kind: tokRange, text: src[1:end]}, end + 1, nil
	}
	if m := durationToken.FindString(src); m != "" && !identContinues(src, len(m)) {
		return token{kind: tokDuration, text: m}, len(m), nil
	}
	if m := numberToken.FindString(src); m != "" {
		return token{kind: tokNumber, text: m}, len(m), nil
	}
	if m := identToken.FindString(src); m != "" {
		return token{kind: tokIdent, text: m}, len(m), nil
	}
	for _, p := range puncts {
		if strings.HasPrefix(src, p) {
			return token{kind: tokPunct, text: p}, len(p), nil
		}
	}
	return token{}, 0, fmt.Errorf("unexpected character %q", src[0])
}

// identContinues reports whether s[i] could continue an identifier: then
// what precedes it is not a duration (5min is no duration).
func identContinues(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	c := s[i]
	return c == '_' || c == ':' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// stringAt reads the string literal src starts with.
func stringAt(src string) (token, int, error) {
	switch src[0] {
	case '`':
		end := strings.IndexByte(src[1:], '`')
		if end < 0 {
			return token{}, 0, fmt.Errorf("unterminated string")
		}
		return token{kind: tokString, text: src[1 : end+1]}, end + 2, nil
	case '\'':
		// As a double-quoted string, whose escapes are Go's.
		for i := 1; i < len(src); i++ {
			switch src[i] {
			case '\\':
				i++
			case '\'':
				s, err := strconv.Unquote(`"` + strings.ReplaceAll(src[1:i], `"`, `\"`) + `"`)
				return token{kind: tokString, text: s}, i + 1, err
			}
		}
		return token{}, 0, fmt.Errorf("unterminated string")
	}
	quoted, err := strconv.QuotedPrefix(src)
	if err != nil {
		return token{}, 0, fmt.Errorf("string: %w", err)
	}
	s, err := strconv.Unquote(quoted)
	return token{kind: tokString, text: s}, len(quoted), err
}

// aggregations are PromQL's aggregation operators.
var aggregations = map[string]bool{
	"sum": true, "avg": true, "count": true, "min": true, "max": true, "group": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true, "limitk": true, "limit_ratio": true,
}

// precedence of the binary operators; ^ alone is right-associative.
var precedence = map[string]int{
	"or": 1, "and": 2, "unless": 2,
	"==": 3, "!=": 3, "<=": 3, "<": 3, ">=": 3, ">": 3,
	"+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6,
}

type parser struct {
	toks []token
	pos  int
}

// parseQuery parses one PromQL expression.
func parseQuery(src string) (node, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	n, err := p.expr(0)
	if err == nil && p.peek().kind != tokEOF {
		err = fmt.Errorf("unexpected %q after the expression", p.peek().text)
	}
	return n, err
}

func (p *parser) peek() token { return p.toks[p.pos] }

func (p *parser) next() token {
	t := p.toks[p.pos]
	if t.kind != tokEOF {
		p.pos++
	}
	return t
}

// is reports whether the next token is an identifier or punctuation text.
func (p *parser) is(text string) bool {
	t := p.peek()
	return (t.kind == tokIdent || t.kind == tokPunct) && t.text == text
}

func (p *parser) expect(text string) error {
	if !p.is(text) {
		return fmt.Errorf("want %q, got %q", text, p.peek().text)
	}
	p.next()
	return nil
}

// expr parses binary operations whose operators bind at least minPrec.
func (p *parser) expr(minPrec int) (node, error) {
	lhs, err := p.unary()
	for err == nil {
		t := p.peek()
		prec, isOp := precedence[t.text]
		if !isOp || (t.kind != tokIdent && t.kind != tokPunct) || prec < minPrec {
			return lhs, nil
		}
		p.next()
		b := &binaryNode{op: t.text, lhs: lhs}
		if b.matching, err = p.modifiers(); err != nil {
			return nil, err
		}
		nextMin := prec + 1
		if t.text == "^" {
			nextMin = prec
		}
		b.rhs, err = p.expr(nextMin)
		lhs = b
	}
	return nil, err
}

// modifiers parses what may follow a binary operator: bool, on (...) or
// ignoring (...), group_left/group_right (...).
func (p *parser) modifiers() (*matching, error) {
	if p.is("bool") {
		p.next()
	}
	if !p.is("on") && !p.is("ignoring") {
		if p.is("group_left") || p.is("group_right") {
			return nil, fmt.Errorf("%s without on or ignoring", p.peek().text)
		}
		return nil, nil
	}
	m := &matching{on: p.next().text == "on"}
	var err error
	if m.labels, err = p.labelList(); err != nil {
		return nil, err
	}
	if p.is("group_left") || p.is("group_right") {
		m.group = strings.TrimPrefix(p.next().text, "group_")
		if p.is("(") {
			m.include, err = p.labelList()
		}
	}
	return m, err
}

// unary parses a unary minus or plus, which binds less than ^.
func (p *parser) unary() (node, error) {
	if p.is("-") || p.is("+") {
		p.next()
		return p.expr(precedence["^"])
	}
	n, err := p.primary()
	if err != nil {
		return nil, err
	}
	return p.postfix(n)
}

// postfix parses a range or subquery and the offset and @ modifiers.
func (p *parser) postfix(n node) (node, error) {
	for {
		switch t := p.peek(); {
		case t.kind == tokRange:
			p.next()
			n = &rangeNode{expr: n}
		case p.is("offset"):
			p.next()
			if p.is("-") {
				p.next()
			}
			if p.next().kind != tokDuration {
				return nil, fmt.Errorf("offset wants a duration")
			}
		case p.is("@"):
			p.next()
			if err := p.atTime(); err != nil {
				return nil, err
			}
		default:
			return n, nil
		}
	}
}

// atTime parses what follows @: a timestamp, start() or end().
func (p *parser) atTime() error {
	if p.peek().kind == tokNumber {
		p.next()
		return nil
	}
	if !p.is("start") && !p.is("end") {
		return fmt.Errorf("@ wants a timestamp, start() or end()")
	}
	p.next()
	if err := p.expect("("); err != nil {
		return err
	}
	return p.expect(")")
}

func (p *parser) primary() (node, error) {
	t := p.peek()
	switch {
	case t.kind == tokNumber:
		p.next()
		return &numberNode{}, nil
	case t.kind == tokString:
		p.next()
		return &stringNode{value: t.text}, nil
	case p.is("("):
		p.next()
		n, err := p.expr(0)
		if err != nil {
			return nil, err
		}
		return n, p.expect(")")
	case p.is("{"):
		return p.selector("")
	case t.kind != tokIdent:
		return nil, fmt.Errorf("unexpected %q", t.text)
	}
	p.next()
	switch {
	case strings.EqualFold(t.text, "inf") || strings.EqualFold(t.text, "nan"):
		return &numberNode{}, nil
	case keywords[t.text]:
		return nil, fmt.Errorf("unexpected %q", t.text)
	case aggregations[t.text] && (p.is("(") || p.is("by") || p.is("without")):
		return p.aggregate(t.text)
	case p.is("("):
		args, err := p.args()
		return &callNode{fn: t.text, args: args}, err
	}
	return p.selector(t.text)
}

// keywords cannot start an expression.
var keywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "offset": true, "and": true, "or": true, "unless": true, "atan2": true,
}

// aggregate parses an aggregation after its operator; its grouping may come
// before or after its arguments.
func (p *parser) aggregate(op string) (node, error) {
	a := &aggregateNode{op: op}
	var err error
	grouped := p.is("by") || p.is("without")
	if grouped {
		a.without = p.next().text == "without"
		if a.grouping, err = p.labelList(); err != nil {
			return nil, err
		}
	}
	if a.args, err = p.args(); err != nil {
		return nil, err
	}
	if !grouped && (p.is("by") || p.is("without")) {
		a.without = p.next().text == "without"
		a.grouping, err = p.labelList()
	}
	return a, err
}

// args parses a parenthesised, comma-separated list of expressions.
func (p *parser) args() ([]node, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	var args []node
	for !p.is(")") {
		n, err := p.expr(0)
		if err != nil {
			return nil, err
		}
		args = append(args, n)
		if !p.is(",") {
			break
		}
		p.next()
	}
	return args, p.expect(")")
}

// labelList parses (label, ...).
func (p *parser) labelList() ([]string, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	var labels []string
	for !p.is(")") {
		t := p.next()
		if t.kind != tokIdent && t.kind != tokString {
			return nil, fmt.Errorf("want a label name, got %q", t.text)
		}
		labels = append(labels, t.text)
		if !p.is(",") {
			break
		}
		p.next()
	}
	return labels, p.expect(")")
}

// selector parses the {matchers} that may follow metric.
func (p *parser) selector(metric string) (node, error) {
	s := &selectorNode{metric: metric}
	if !p.is("{") {
		return s, nil
	}
	p.next()
	for !p.is("}") {
		label := p.next()
		if label.kind != tokIdent && label.kind != tokString {
			return nil, fmt.Errorf("want a label name, got %q", label.text)
		}
		op := p.next()
		if op.kind != tokPunct || (op.text != "=" && op.text != "!=" && op.text != "=~" && op.text != "!~") {
			return nil, fmt.Errorf("label %s: want a matcher (=, !=, =~, !~), got %q", label.text, op.text)
		}
		if p.next().kind != tokString {
			return nil, fmt.Errorf("label %s: want a quoted value", label.text)
		}
		s.matchers = append(s.matchers, label.text)
		if !p.is(",") {
			break
		}
		p.next()
	}
	return s, p.expect("}")
}
