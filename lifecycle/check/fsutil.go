package check

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// dataFile is the file the scenarios write into filesystem volumes.
const dataFile = "csi-volmgr-check.data"

func randomData(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// writeData writes data into the volume at dir, durably.
func writeData(dir string, data []byte) error {
	f, err := os.OpenFile(filepath.Join(dir, dataFile), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// checkData says what is wrong with the data file at dir, "" when it
// holds want.
func checkData(dir string, want []byte) string {
	got, err := os.ReadFile(filepath.Join(dir, dataFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "the file written before is not there"
	case err != nil:
		return "reading it failed: " + err.Error()
	case !bytes.Equal(got, want):
		return fmt.Sprintf("it holds %d other bytes", len(got))
	}
	return ""
}

// writeDevice writes data at the start of the block device dev, durably.
func writeDevice(dev string, data []byte) error {
	f, err := os.OpenFile(dev, os.O_WRONLY|os.O_SYNC, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// readDevice reads n bytes at the start of dev.
func readDevice(dev string, n int) ([]byte, error) {
	f, err := os.Open(dev)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b := make([]byte, n)
	_, err = f.ReadAt(b, 0)
	return b, err
}

// statfsBytes returns the size of the file system at path, as df shows it.
func statfsBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks) * st.Bsize, nil
}

// readTree reads every regular file below dir: path relative to dir ->
// contents.
func readTree(dir string) (map[string]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files[rel] = string(b)
		return nil
	})
	return files, err
}

// sameTree says how the files below dir differ from want, "" when they
// do not.
func sameTree(dir string, want map[string]string) string {
	got, err := readTree(dir)
	if err != nil {
		return err.Error()
	}
	for name, contents := range want {
		if g, ok := got[name]; !ok {
			return name + " is gone"
		} else if g != contents {
			return name + " changed"
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			return name + " appeared"
		}
	}
	return ""
}
