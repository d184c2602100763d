package replay

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/rules"
)

// ParseBackgroundAttack reads one abusive-client value (sluice eval
// --abusive, a line of an --abusive-file): [NAME:]KEY=VALUE[,KEY=VALUE] by
// descriptor key, where a client_ip may be a CIDR network no broader than a
// /8 (IPv6 /16). Values of one NAME are one attacker; without a name, the
// value names itself. The attack's Name is "background " and the name.
func ParseBackgroundAttack(a string) (BackgroundAttack, error) {
	name, spec := "background "+a, a
	if n, rest, ok := strings.Cut(a, ":"); ok && !strings.Contains(n, "=") {
		if strings.TrimSpace(n) == "" {
			return BackgroundAttack{}, fmt.Errorf("abusive %q: an empty NAME before ':' (omit the ':' to let the value name itself)", a)
		}
		name, spec = "background "+strings.TrimSpace(n), strings.TrimSpace(rest)
	}
	scope := map[string]string{}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			return BackgroundAttack{}, fmt.Errorf("abusive %q: want [NAME:]KEY=VALUE[,KEY=VALUE], e.g. client_ip=198.72.227.213", a)
		}
		key, _ := rules.KeyFor(k)
		if key == rules.KeyCustom {
			_, err := rules.ParseKey(k) // names the keys there are
			return BackgroundAttack{}, fmt.Errorf("abusive %q: no descriptor a replay gives requests: %w", a, err)
		}
		if _, dup := scope[k]; dup {
			return BackgroundAttack{}, fmt.Errorf("abusive %q: %s given twice: one value a key (give a second value its own --abusive, with the same NAME to make them one attacker)", a, k)
		}
		switch {
		case key == rules.KeyClientIP && strings.Contains(v, "/"):
			n, err := netip.ParsePrefix(v)
			if err != nil {
				return BackgroundAttack{}, fmt.Errorf("abusive %q: client_ip network: %w", a, err)
			}
			// One attacker is not a /0: it would label the whole
			// background an attack and make any rule a true positive.
			if n.Addr().Unmap().Is4() && n.Bits()-(n.Addr().BitLen()-32) < 8 || !n.Addr().Unmap().Is4() && n.Bits() < 16 {
				return BackgroundAttack{}, fmt.Errorf("abusive %q: client_ip network broader than a /8 (IPv6 /16): one attacker's addresses, not a share of the Internet", a)
			}
		case key == rules.KeyClientIP:
			if _, err := netip.ParseAddr(v); err != nil {
				return BackgroundAttack{}, fmt.Errorf("abusive %q: client_ip: %w", a, err)
			}
		case key == rules.KeyASN:
			if _, err := strconv.ParseUint(v, 10, 32); err != nil {
				return BackgroundAttack{}, fmt.Errorf("abusive %q: asn %q: want the AS number alone, e.g. asn=29518", a, v)
			}
		}
		scope[k] = v
	}
	return BackgroundAttack{Name: name, Scope: scope}, nil
}

// ReadBackgroundAttacks reads a file of abusive-client values
// (testdata/eval/*.abusive): one ParseBackgroundAttack value a line,
// anything after # a comment, blank lines skipped. A bad line is an error
// naming the file and line.
func ReadBackgroundAttacks(path string) ([]BackgroundAttack, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []BackgroundAttack
	for i, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		a, err := ParseBackgroundAttack(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, i+1, err)
		}
		out = append(out, a)
	}
	return out, nil
}
