package envdoc

import (
	"fmt"
	"os"
	"strings"
)

// expand substitutes $NAME, ${NAME}, ${NAME:-default} and ${NAME:?message}
// in s, as a shell and Compose do, looking names up in vars. A name that
// ${NAME:?…} requires and vars lacks is an error, as it stops Compose.
func expand(s string, vars map[string]string) (string, error) {
	var missing []string
	out := os.Expand(strings.ReplaceAll(s, "$$", "\x00"), func(ref string) string {
		name, def, hasDefault := strings.Cut(ref, ":-")
		if hasDefault {
			if v := vars[name]; v != "" {
				return v
			}
			v, err := expand(def, vars)
			if err != nil {
				missing = append(missing, err.Error())
			}
			return v
		}
		if name, _, required := strings.Cut(ref, ":?"); required {
			if vars[name] == "" {
				missing = append(missing, name)
			}
			return vars[name]
		}
		return vars[ref]
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("%s unset", strings.Join(missing, ", "))
	}
	return strings.ReplaceAll(out, "\x00", "$"), nil
}
