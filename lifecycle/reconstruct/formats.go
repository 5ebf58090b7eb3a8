package reconstruct

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"k8s.io/klog/v2"

	"github.com/csi-volmgr/csi-volmgr/lifecycle/checkpoint"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/paths"
)

// checkFormats reads the format version of every record under the layout —
// the staged-volume records, the pod volume records and the front
// endpoint's — and returns every record of a format newer than this agent
// knows (each a *checkpoint.FormatError), joined. It runs before anything
// is reconstructed, migrated or removed: an agent that finds such a record
// (a rollback below the version that wrote it) refuses to start and leaves
// the whole root directory as it is, rather than act on the volumes it can
// read and leave the others to a reconciler that would take their mounts
// for missing. Records it cannot read at all are not its business: the
// reconstruction reports them as before.
func checkFormats(layout paths.Layout) error {
	var records []string
	staged, err := layout.StagedVolumes()
	if err != nil {
		return fmt.Errorf("scan staged volumes: %w", err)
	}
	for _, sv := range staged {
		records = append(records, sv.Record)
	}
	pods, err := layout.PodVolumes()
	if err != nil {
		return fmt.Errorf("scan pod volumes: %w", err)
	}
	for _, pv := range pods {
		records = append(records, pv.Record)
	}
	// A front directory that cannot be read whole is reported by front.
	callers, _ := layout.CallerRecords()
	for _, r := range callers {
		records = append(records, r.Record)
	}
	var newer []error
	for _, path := range records {
		_, err := checkpoint.CheckFormat(path)
		if errors.Is(err, checkpoint.ErrNewerFormat) {
			newer = append(newer, err)
		}
	}
	if len(newer) > 0 {
		return fmt.Errorf("%d volume record(s) of a newer format; nothing was reconstructed, changed or removed: %w",
			len(newer), errors.Join(newer...))
	}
	return nil
}

// migrate brings a record that was reconstructed to the current format
// (checkpoint.Migrate). A failure is logged and changes nothing: the record
// keeps its old format, which this agent reads, and the next start tries
// again.
func migrate(ctx context.Context, record string, res *Result) {
	migrated, err := checkpoint.Migrate(record)
	switch {
	case err == nil && migrated:
		res.Migrated++
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		klog.FromContext(ctx).Error(err, "Cannot migrate a volume record to the current format; it stays readable as it is", "record", record)
	}
}
