package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/csi-volmgr/csi-volmgr/volumemanager"
)

// clientOptions choose how the client commands reach the agent: its API
// socket by default (root only, no credentials), or its --http-endpoint
// with a bearer token or a client certificate the agent authenticates and
// the API server authorizes, over TLS (clienttls.go).
type clientOptions struct {
	rootDir   string
	socket    string
	server    string
	token     string
	tokenFile string
	output    string
	tls       clientTLSOptions
}

func (o *clientOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.rootDir, "root-dir", "/var/lib/csi-volmgr", "The agent's --root-dir: the client talks to its API socket <root-dir>/"+volumemanager.SocketName+" (root only) unless --socket or --server is given.")
	cmd.Flags().StringVar(&o.socket, "socket", "", "Path of the agent's API socket; empty means <root-dir>/"+volumemanager.SocketName+".")
	cmd.Flags().StringVar(&o.server, "server", "", "URL of the agent's --http-endpoint (e.g. https://10.0.0.7:9809; https:// when no scheme is given, http:// only to an agent run with --http-endpoint-plaintext) to use instead of the socket; its API needs a credential: --token or --token-file, a bearer token for the audience csi-volmgr, or --client-certificate and --client-key of the agent's --client-ca-file, whose user the API server authorizes for get on nodes/csi-volmgr of the agent's Node.")
	cmd.Flags().StringVar(&o.token, "token", "", "Bearer token for --server, issued for the agent's audience (kubectl create token SA --audience csi-volmgr). Never sent over http:// to an address other than a loopback one.")
	cmd.Flags().StringVar(&o.tokenFile, "token-file", "", "File holding the bearer token for --server (e.g. a projected ServiceAccount token of audience csi-volmgr).")
	o.tls.addFlags(cmd)
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "Output format: table or json.")
}

func (o *clientOptions) validate() error {
	var errs []error
	if o.output != "table" && o.output != "json" {
		errs = append(errs, fmt.Errorf("--output %q: want table or json", o.output))
	}
	if o.server != "" && o.socket != "" {
		errs = append(errs, errors.New("--server and --socket cannot be used together"))
	}
	if o.token != "" && o.tokenFile != "" {
		errs = append(errs, errors.New("--token and --token-file cannot be used together"))
	}
	if o.server == "" && (o.token != "" || o.tokenFile != "") {
		errs = append(errs, errors.New("--token and --token-file are for --server: the socket needs none"))
	}
	errs = append(errs, o.tls.validate(o.server)...)
	return errors.Join(errs...)
}

// target returns the URL prefix of the agent, the client that reaches it,
// the bearer token to send (empty for the socket) and how to name the
// agent in errors.
func (o *clientOptions) target() (base string, client *http.Client, token, name string, err error) {
	if o.server == "" {
		socket := o.socket
		if socket == "" {
			socket = volumemanager.SocketPath(o.rootDir)
		}
		dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}
		// The host is never resolved: every connection goes to the socket.
		return "http://csi-volmgr", &http.Client{Transport: &http.Transport{DialContext: dial}}, "", "the agent's socket " + socket, nil
	}
	base = serverURL(o.server)
	token = o.token
	if o.tokenFile != "" {
		data, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return "", nil, "", "", fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(data))
	}
	if client, err = o.tls.client(base, token != ""); err != nil {
		return "", nil, "", "", err
	}
	return base, client, token, "the agent at " + o.server, nil
}

// get fetches path from the agent and decodes it into v, returning the raw body too.
func (o *clientOptions) get(ctx context.Context, path string, v any) ([]byte, error) {
	code, body, name, err := o.fetch(ctx, path, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s answered %d %s: %s", name, code, http.StatusText(code), strings.TrimSpace(string(body)))
	}
	return body, json.Unmarshal(body, v)
}

// fetch GETs path from the agent within timeout and returns the status
// code, the body and how to name the agent in errors.
func (o *clientOptions) fetch(ctx context.Context, path string, timeout time.Duration) (code int, body []byte, name string, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	base, client, token, name, err := o.target()
	if err != nil {
		return 0, nil, "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return 0, nil, name, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, name, fmt.Errorf("asking %s: %w", name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, name, fmt.Errorf("reading the answer of %s: %w", name, err)
	}
	return resp.StatusCode, body, name, nil
}

func newStatusCommand() *cobra.Command {
	o := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every volume the agent holds: driver, handle, state, pods and last error",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			var vols []volumemanager.VolumeStatus
			raw, err := o.get(cmd.Context(), volumemanager.VolumesPath, &vols)
			if err != nil {
				return err
			}
			if o.output == "json" {
				_, err := cmd.OutOrStdout().Write(raw)
				return err
			}
			if err := printVolumes(cmd.OutOrStdout(), vols, time.Now()); err != nil {
				return err
			}
			var pods []volumemanager.PodVolumes
			if _, err := o.get(cmd.Context(), volumemanager.PodsPath, &pods); err != nil {
				return err
			}
			return printAwaitingRuntime(cmd.OutOrStdout(), pods)
		},
	}
	o.addFlags(cmd)
	return cmd
}

func printVolumes(out io.Writer, vols []volumemanager.VolumeStatus, now time.Time) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tDRIVER\tHANDLE\tSTATE\tPODS\tUSED\tHEALTH\tLAST ERROR")
	for _, v := range vols {
		state := v.State
		if v.Attached {
			state = "Attached," + state
		}
		var pods []string
		lastErr := v.LastError
		for _, p := range v.Pods {
			who := p.UID
			if p.Name != "" {
				who = p.Namespace + "/" + p.Name
			}
			pods = append(pods, who+"="+p.State)
			if lastErr == nil && p.LastError != nil {
				lastErr = p.LastError
			}
		}
		used, health := describeStats(v.Stats)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", displayName(v), v.Driver, shorten(v.Handle, 40), state,
			orNone(strings.Join(pods, ",")), used, health, describeError(lastErr, now))
	}
	return tw.Flush()
}

// printAwaitingRuntime lists the pods whose volumes stay mounted until
// their runtime says their containers stopped; nothing when there are none.
func printAwaitingRuntime(out io.Writer, pods []volumemanager.PodVolumes) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := false
	for _, p := range pods {
		if p.State != volumemanager.PodVolumesAwaitingRuntime {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "\nPOD\tUID\tSTATE\tWHY")
			header = true
		}
		who := "<unknown>"
		if p.Name != "" {
			who = p.Namespace + "/" + p.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", who, p.UID, p.State, p.Message)
	}
	return tw.Flush()
}

func displayName(v volumemanager.VolumeStatus) string {
	if v.PVName != "" {
		return v.PVName
	}
	return v.Name
}

func describeError(e *volumemanager.ErrorInfo, now time.Time) string {
	if e == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s: %s (%s ago)", e.Step, shorten(e.Message, 80), now.Sub(e.Time).Round(time.Second))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

func newDriversCommand() *cobra.Command {
	o := &clientOptions{}
	cmd := &cobra.Command{
		Use:   "drivers",
		Short: "Show the registered CSI drivers: endpoints, versions, capabilities, node ID",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			var drivers []volumemanager.DriverStatus
			raw, err := o.get(cmd.Context(), volumemanager.DriversPath, &drivers)
			if err != nil {
				return err
			}
			if o.output == "json" {
				_, err := cmd.OutOrStdout().Write(raw)
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "DRIVER\tENDPOINT\tVERSION\tNODE ID\tMAX VOLUMES\tCAPABILITIES")
			for _, d := range drivers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", d.Name, d.Endpoint, d.Version, d.NodeID, d.MaxVolumes, orNone(strings.Join(d.Capabilities, ",")))
			}
			return tw.Flush()
		},
	}
	o.addFlags(cmd)
	return cmd
}

// describeStats renders a volume's usage ("12Mi/1Gi") and health
// ("Healthy", or the adverse conditions' statuses and reasons); "-" when
// the driver reports none.
func describeStats(s *volumemanager.VolumeStatsStatus) (used, health string) {
	used, health = "-", "-"
	if s == nil {
		return used, health
	}
	if s.UsedBytes != nil && s.CapacityBytes != nil {
		used = resource.NewQuantity(*s.UsedBytes, resource.BinarySI).String() + "/" + resource.NewQuantity(*s.CapacityBytes, resource.BinarySI).String()
	}
	var parts []string
	for _, h := range s.Health {
		part := h.Status
		if h.Reason != "" {
			part += "(" + h.Reason + ")"
		}
		parts = append(parts, part)
	}
	if len(parts) > 0 {
		health = strings.Join(parts, ",")
	}
	return used, health
}
