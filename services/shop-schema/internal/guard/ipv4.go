package guard

import (
	"net/netip"
	"strconv"
	"strings"
)

// endsInNumber is the WHATWG URL test that makes a host an IPv4 address:
// its last label is all digits or is written as an IPv4 number (0x…, 0…),
// whatever its size: "0x100000000" is an IPv4 address too large, so an
// invalid host, not a name.
func endsInNumber(host string) bool {
	labels := strings.Split(host, ".")
	last := labels[len(labels)-1]
	if last == "" {
		return false
	}
	return strings.Trim(last, "0123456789") == "" || ipv4NumberSyntax(last)
}

// ipv4NumberSyntax reports whether s is written as an IPv4 number: decimal,
// 0x and hex digits, or 0 and octal digits.
func ipv4NumberSyntax(s string) bool {
	digits := "0123456789"
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, digits = s[2:], "0123456789abcdefABCDEF"
	case len(s) >= 2 && s[0] == '0':
		s, digits = s[1:], "01234567"
	}
	return strings.Trim(s, digits) == ""
}

// parseWHATWGIPv4 decodes host the way browsers and inet_aton do: one to
// four parts, each decimal, octal (leading 0) or hex (0x), the last part
// filling the remaining bytes, so "127.1", "0x7f.0.0.1", "017700000001" and
// "2130706433" all mean 127.0.0.1.
func parseWHATWGIPv4(host string) (netip.Addr, bool) {
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		n, ok := parseIPv4Number(p)
		if !ok {
			return netip.Addr{}, false
		}
		nums[i] = n
	}
	var v uint64
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v |= n << (8 * (3 - i))
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v |= last
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func parseIPv4Number(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	base := 10
	switch {
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" {
		return 0, true
	}
	if len(s) > 16 { // longer than any 32-bit value in any base; avoid overflow games
		return 0, false
	}
	n, err := strconv.ParseUint(s, base, 64)
	if err != nil || n > 0xFFFFFFFF {
		return 0, false
	}
	return n, true
}
