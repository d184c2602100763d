package enrich

import (
	"fmt"
	"os"
	"path/filepath"
)

// FindData returns the shared data folder (ASN databases, JA4 tables, access
// logs): ../shared/data beside the repository root, the first directory at or
// above dir that holds a go.mod. It returns an error naming where it looked
// when there is none.
func FindData(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for start := dir; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod at or above %s, so no ../shared/data beside it", start)
		}
		dir = parent
	}
	data := filepath.Join(dir, "..", "shared", "data")
	if st, err := os.Stat(data); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s is absent", filepath.Clean(data))
	}
	return filepath.Clean(data), nil
}
