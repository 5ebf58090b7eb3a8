//go:build tools

// Package tools pins the main package make drivers builds into bin/drivers/juicefs.
package tools

import _ "github.com/juicedata/juicefs-csi-driver/cmd"
