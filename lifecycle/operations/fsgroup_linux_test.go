package operations

import (
	"io/fs"
	"syscall"
)

func statGID(fi fs.FileInfo) uint32 { return fi.Sys().(*syscall.Stat_t).Gid }
