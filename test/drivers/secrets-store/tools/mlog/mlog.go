// Package mlog is the part of monis.app/mlog's API that secrets-store-csi-driver v1.6.0 calls:
// log set-up and two logging helpers, over klog (text format; JSON is refused, not faked).
package mlog

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// LogFormat is the format of the log lines.
type LogFormat string

// The formats the driver asks for.
const (
	FormatText LogFormat = "text"
	FormatJSON LogFormat = "json"
)

// Setup prepares logging and returns the function that flushes it.
func Setup() func() { return klog.Flush }

// ValidateAndSetKlogLevelAndFormatGlobally checks the level and the format. klog keeps the
// verbosity that its flags set; only the text format is supported here.
func ValidateAndSetKlogLevelAndFormatGlobally(_ context.Context, level klog.Level, format LogFormat) error {
	if level < 0 {
		return fmt.Errorf("invalid log level %d", level)
	}
	if format != FormatText {
		return errors.New("this stand-in for monis.app/mlog supports only the text log format")
	}
	return nil
}

// Error logs err with msg and key/value pairs.
func Error(msg string, err error, keysAndValues ...any) {
	klog.ErrorSDepth(1, err, msg, keysAndValues...)
}

// Fatal logs err and exits with status 1.
func Fatal(err error, keysAndValues ...any) {
	klog.ErrorSDepth(1, err, "fatal error", keysAndValues...)
	klog.FlushAndExit(klog.ExitFlushTimeout, 1)
}
