package manifest

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds the canonical JSON encoder and the strict JSON parser of
// manifests. The parser is ours rather than encoding/json's because a
// manifest must reject what encoding/json accepts silently (duplicate keys)
// and its errors are part of the contract (tests compare their exact text).

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string: '"' and '\' escaped with a
// backslash, control characters as \u00XX, invalid UTF-8 as \ufffd, every
// other character as itself.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return append(b, '"')
}

// appendInts appends a JSON array of integers.
func appendInts(b []byte, v []int) []byte {
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	return append(b, ']')
}

// maxDepth bounds the nesting of a manifest's JSON; a valid manifest nests
// four levels deep.
const maxDepth = 16

// value is one parsed JSON value.
type value struct {
	kind   kind
	str    string   // string: the decoded text; number: the literal
	keys   []string // object keys in input order
	fields map[string]*value
	elems  []*value // array elements
}

type kind int

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func (k kind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "an array", "an object"}[k]
}

// pathElem is one step of the path to a value: an object key or an array
// index.
type pathElem struct {
	key   string
	index int // used when key is ""
	isKey bool
}

// formatPath prints a path as descriptor.layers[2]. Keys that are not
// short words of letters, digits and _ are quoted (and cut to 64 bytes), so
// that a message stays one short line.
func formatPath(path []pathElem) string {
	var b []byte
	for i, p := range path {
		if p.isKey {
			if i > 0 {
				b = append(b, '.')
			}
			if isWord(p.key) {
				b = append(b, p.key...)
			} else {
				b = fmt.Appendf(b, "%.64q", p.key)
			}
		} else {
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(p.index), 10)
			b = append(b, ']')
		}
	}
	return string(b)
}

func isWord(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// parser parses one JSON document strictly: RFC 8259 syntax, valid UTF-8,
// no duplicate keys, bounded nesting.
type parser struct {
	data []byte
	pos  int
	path []pathElem
}

func (p *parser) syntaxErr(format string, args ...any) error {
	return fmt.Errorf("manifest is not valid json: %s at byte %d", fmt.Sprintf(format, args...), p.pos)
}

// unexpected reports the byte at the current position, or the end.
func (p *parser) unexpected(want string) error {
	if p.pos >= len(p.data) {
		return p.syntaxErr("unexpected end of input; want %s", want)
	}
	return p.syntaxErr("unexpected %s; want %s", quoteByte(p.data[p.pos]), want)
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func parseJSON(data []byte) (*value, error) {
	p := &parser{data: data}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos < len(p.data) {
		return nil, p.unexpected("the end of input")
	}
	return v, nil
}

func (p *parser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (*value, error) {
	if p.pos >= len(p.data) {
		return nil, p.unexpected("a value")
	}
	switch c := p.data[p.pos]; {
	case c == '{' || c == '[':
		if depth >= maxDepth {
			return nil, fmt.Errorf("manifest nests more than %d levels deep at byte %d", maxDepth, p.pos)
		}
		if c == '{' {
			return p.object(depth)
		}
		return p.array(depth)
	case c == '"':
		s, err := p.string()
		if err != nil {
			return nil, err
		}
		return &value{kind: kindString, str: s}, nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true", kindBool)
	case c == 'f':
		return p.literal("false", kindBool)
	case c == 'n':
		return p.literal("null", kindNull)
	}
	return nil, p.unexpected("a value")
}

func (p *parser) literal(word string, k kind) (*value, error) {
	for i := 0; i < len(word); i++ {
		if p.pos >= len(p.data) || p.data[p.pos] != word[i] {
			return nil, p.unexpected(strconv.Quote(word))
		}
		p.pos++
	}
	return &value{kind: k, str: word}, nil
}

func (p *parser) object(depth int) (*value, error) {
	p.pos++ // {
	v := &value{kind: kindObject, fields: map[string]*value{}}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.unexpected("an object key")
		}
		keyPos := p.pos
		key, err := p.string()
		if err != nil {
			return nil, err
		}
		p.path = append(p.path, pathElem{key: key, isKey: true})
		if _, dup := v.fields[key]; dup {
			p.pos = keyPos
			return nil, fmt.Errorf("manifest has duplicate key %s at byte %d", formatPath(p.path), keyPos)
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.unexpected("':'")
		}
		p.pos++
		p.space()
		elem, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		p.path = p.path[:len(p.path)-1]
		v.keys = append(v.keys, key)
		v.fields[key] = elem
		p.space()
		if p.pos < len(p.data) && p.data[p.pos] == ',' {
			p.pos++
			p.space()
			continue
		}
		if p.pos < len(p.data) && p.data[p.pos] == '}' {
			p.pos++
			return v, nil
		}
		return nil, p.unexpected("',' or '}'")
	}
}

func (p *parser) array(depth int) (*value, error) {
	p.pos++ // [
	v := &value{kind: kindArray}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.path = append(p.path, pathElem{index: len(v.elems)})
		elem, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		p.path = p.path[:len(p.path)-1]
		v.elems = append(v.elems, elem)
		p.space()
		if p.pos < len(p.data) && p.data[p.pos] == ',' {
			p.pos++
			p.space()
			continue
		}
		if p.pos < len(p.data) && p.data[p.pos] == ']' {
			p.pos++
			return v, nil
		}
		return nil, p.unexpected("',' or ']'")
	}
}

func (p *parser) number() (*value, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.data[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.data) && p.data[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return nil, p.unexpected("a digit")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return nil, p.unexpected("a digit")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, p.unexpected("a digit")
		}
	}
	return &value{kind: kindNumber, str: string(p.data[start:p.pos])}, nil
}

// string parses a JSON string at p.pos and returns its decoded text.
func (p *parser) string() (string, error) {
	p.pos++ // "
	var b []byte
	start := p.pos
	for {
		if p.pos >= len(p.data) {
			return "", p.syntaxErr("unterminated string")
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			s := string(append(b, p.data[start:p.pos]...))
			p.pos++
			return s, nil
		case c == '\\':
			b = append(b, p.data[start:p.pos]...)
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			b = utf8.AppendRune(b, r)
			start = p.pos
		case c < 0x20:
			return "", p.syntaxErr("control character 0x%02x in string", c)
		case c < utf8.RuneSelf:
			p.pos++
		default:
			r, n := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && n == 1 {
				return "", p.syntaxErr("invalid utf-8 in string")
			}
			p.pos += n
		}
	}
}

// escape decodes one escape sequence at p.pos (at the backslash).
func (p *parser) escape() (rune, error) {
	p.pos++ // backslash
	if p.pos >= len(p.data) {
		return 0, p.syntaxErr("unterminated string")
	}
	c := p.data[p.pos]
	p.pos++
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if utf16.IsSurrogate(r) {
			// A high surrogate must be followed by an escaped low one.
			if r < 0xdc00 && p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
				save := p.pos
				p.pos += 2
				r2, err := p.hex4()
				if err != nil {
					return 0, err
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					return d, nil
				}
				p.pos = save
			}
			return utf8.RuneError, nil
		}
		return r, nil
	}
	p.pos--
	return 0, p.syntaxErr("invalid escape %s", quoteByte(c))
}

func (p *parser) hex4() (rune, error) {
	var r rune
	for range 4 {
		if p.pos >= len(p.data) {
			return 0, p.syntaxErr("unterminated string")
		}
		c := p.data[p.pos]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, p.syntaxErr("invalid hex digit %s in \\u escape", quoteByte(c))
		}
		r = r<<4 | rune(d)
		p.pos++
	}
	return r, nil
}
