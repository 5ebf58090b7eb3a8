//go:build tools

// Package client pins the main package make drivers builds into bin/drivers/juicefs.
package client

import _ "github.com/juicedata/juicefs"
