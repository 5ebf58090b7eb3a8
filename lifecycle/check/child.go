package check

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/csi-volmgr/csi-volmgr/csiclient"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/asw"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/operations"
	"github.com/csi-volmgr/csi-volmgr/lifecycle/volume"
)

// ChildCommand returns the command that runs RunChild in a process of its
// own (e.g. the csi-volmgr binary's hidden check-step command). The check
// writes the step to its stdin and reads its progress from its stdout.
type ChildCommand func(ctx context.Context) *exec.Cmd

// childSpec is what a volume manager process is to do: the steps, on one
// volume and one pod, over the scenario's root.
type childSpec struct {
	Root           string            `json:"root"`
	Endpoint       string            `json:"endpoint"`
	Driver         string            `json:"driver"`
	Timeout        time.Duration     `json:"timeout"`
	Source         volume.Source     `json:"source"`
	Policy         volume.Policy     `json:"policy"`
	PublishContext map[string]string `json:"publishContext,omitempty"`
	Pod            int               `json:"pod"`
	ReadOnly       bool              `json:"readOnly,omitempty"`
	// Secrets are Config.Secrets, on the child's stdin.
	Secrets map[string]string `json:"secrets,omitempty"`
	// Steps are "stage", "publish" and "unpublish", in order.
	Steps []string `json:"steps"`
}

// Lines a child writes.
const (
	lineCall  = "call "  // + method: a CSI call is about to be sent
	lineDone  = "done "  // + step
	lineError = "error " // + message
	lineRec   = "rec "   // + JSON Call: a CSI call that ended
)

// RunChild is a volume manager process of the crash scenarios: it reads a
// step from in, runs it with csi-volmgr's operations over the scenario's
// root (a fresh actual state, as after a start), reports on out, and then
// waits to be killed (it exits when in is closed). It returns the exit
// code.
func RunChild(ctx context.Context, in io.Reader, out io.Writer) int {
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}
	dec := json.NewDecoder(in)
	var spec childSpec
	if err := dec.Decode(&spec); err != nil {
		say(lineError+"reading the step: %v", err)
		return 2
	}
	client, err := csiclient.New(ctx, csiclient.Config{DriverName: spec.Driver, Endpoint: spec.Endpoint, Timeout: spec.Timeout})
	if err != nil {
		say(lineError+"%v", err)
		return 1
	}
	defer func() { _ = client.Close() }()
	rec := newRecorder(client, 0)
	rec.onCall = func(method string) { say(lineCall + method) }
	w := asw.New(asw.Options{})
	ops, err := operations.New(operations.Config{
		RootDir:     spec.Root,
		NodeName:    nodeName,
		Drivers:     operations.DriversFunc(func(string) (operations.DriverClient, bool) { return rec, true }),
		Policies:    policies{spec.Policy},
		Attachments: staticAttachment(spec),
		Secrets:     staticSecrets(spec.Secrets),
		State:       w,
	})
	if err != nil {
		say(lineError+"%v", err)
		return 1
	}
	v := &vol{src: spec.Source, name: volume.PersistentName(spec.Source.Driver, spec.Source.Handle)}
	if spec.Source.Inline {
		v.name, v.readOnly = volume.InlineName(podUID(spec.Pod), specName), spec.ReadOnly
	}
	key, pv := pod(v, spec.Pod)
	m := &manager{world: w, ops: ops}
	for _, step := range spec.Steps {
		switch step {
		case "stage":
			err = m.stage(ctx, v, nil)
		case "publish":
			err = ops.Publish(ctx, key, v.src, pv)
		case "unpublish":
			err = ops.Unpublish(ctx, key)
		default:
			err = fmt.Errorf("unknown step %q", step)
		}
		for _, c := range rec.take() {
			data, _ := json.Marshal(c)
			say(lineRec + string(data))
		}
		if err != nil {
			say(lineError+"%s: %s", step, describe(err))
			return 1
		}
		say(lineDone + step)
	}
	_, _ = io.Copy(io.Discard, in)
	return 0
}

type staticAttachment childSpec

func (s staticAttachment) Get(name string) (*storagev1.VolumeAttachment, error) {
	if volume.AttachmentName(s.Source.Handle, s.Source.Driver, nodeName) != name {
		return nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
	}
	return attachment(name, s.Source, s.PublishContext), nil
}

// crash runs steps on v for pod i in a volume manager process of its own
// and SIGKILLs it once the last step is done, or KillAfter after the last
// step's CSI call was sent, whichever comes first. It returns how the
// process ended, for the report.
func (r *run) crash(ctx context.Context, v *vol, i int, steps []string) (string, error) {
	spec := childSpec{Root: r.root, Endpoint: r.cfg.Endpoint, Driver: r.driver, Timeout: r.cfg.Timeout,
		Source: v.src, Policy: r.policy(), PublishContext: v.publishContext, Pod: i, ReadOnly: v.readOnly, Steps: steps, Secrets: r.cfg.Secrets}
	cmd := r.cfg.Child(ctx)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("starting the volume manager process: %w", err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	kill := func() {
		_ = cmd.Process.Kill()
		_ = stdin.Close()
	}
	defer func() {
		kill()
		for range lines {
		}
		_ = cmd.Wait()
	}()
	if err := json.NewEncoder(stdin).Encode(spec); err != nil {
		return "", fmt.Errorf("sending the step: %w", err)
	}
	last := steps[len(steps)-1]
	done := map[string]bool{}
	var timer <-chan time.Time
	inFlight := ""
	for {
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-timer:
			kill()
			r.rec.add(Call{Method: inFlight, Code: "-", Duration: r.cfg.KillAfter,
				Note: fmt.Sprintf("volume manager process SIGKILLed %s into the call", r.cfg.KillAfter)})
			return fmt.Sprintf("killed %s into %s", r.cfg.KillAfter, inFlight), nil
		case line, ok := <-lines:
			if !ok {
				return "", errors.New("the volume manager process exited before it was killed")
			}
			switch {
			case strings.HasPrefix(line, lineRec):
				var c Call
				if json.Unmarshal([]byte(strings.TrimPrefix(line, lineRec)), &c) == nil {
					c.Note = strings.TrimSpace("in the volume manager process that is then killed " + c.Note)
					r.rec.add(c)
				}
			case strings.HasPrefix(line, lineCall):
				allBefore := true
				for _, s := range steps[:len(steps)-1] {
					allBefore = allBefore && done[s]
				}
				if allBefore && timer == nil {
					inFlight = strings.TrimPrefix(line, lineCall)
					timer = time.After(r.cfg.KillAfter)
				}
			case strings.HasPrefix(line, lineDone):
				step := strings.TrimPrefix(line, lineDone)
				done[step] = true
				if step == last {
					kill()
					return "killed after " + last, nil
				}
			case strings.HasPrefix(line, lineError):
				return "", fail("the volume manager process's "+strings.Join(steps, ", "), "each step to succeed",
					strings.TrimPrefix(line, lineError))
			}
		}
	}
}
