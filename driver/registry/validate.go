package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// maxDriverNameLength is the CSI limit on a driver name (CSI spec, GetPluginInfo).
const maxDriverNameLength = 63

// ErrInvalidRegistration is wrapped by every validation failure of a GetInfo answer.
var ErrInvalidRegistration = errors.New("invalid plugin registration")

// Candidate is a validated GetInfo answer: a CSI driver that asks to be registered.
type Candidate struct {
	// Name is the CSI driver name.
	Name string
	// Endpoint is the absolute path of the driver's CSI socket.
	Endpoint string
	// Version is the highest supported 1.x CSI version the driver offered.
	Version *utilversion.Version
	// SupportedVersions is the list the driver offered, as given.
	SupportedVersions []string
}

// ValidateInfo checks a GetInfo answer the way the kubelet's CSI registration
// handler does, and stricter: the type must be CSIPlugin, one offered version
// must be 1.x, the name must be a DNS-1123 subdomain of at most 63 characters,
// and the endpoint must be an absolute, clean path. It does not touch the file
// system; CheckEndpoint does.
func ValidateInfo(info *registerapi.PluginInfo) (Candidate, error) {
	if info == nil {
		return Candidate{}, fmt.Errorf("%w: empty GetInfo answer", ErrInvalidRegistration)
	}
	if info.Type != registerapi.CSIPlugin {
		return Candidate{}, fmt.Errorf("%w: plugin type %q is not %q", ErrInvalidRegistration, truncate(info.Type), registerapi.CSIPlugin)
	}
	if err := validateDriverName(info.Name); err != nil {
		return Candidate{}, err
	}
	version, err := highestSupportedVersion(info.SupportedVersions)
	if err != nil {
		return Candidate{}, err
	}
	endpoint, err := validateEndpointPath(info.Endpoint)
	if err != nil {
		return Candidate{}, err
	}
	return Candidate{
		Name:              info.Name,
		Endpoint:          endpoint,
		Version:           version,
		SupportedVersions: append([]string(nil), info.SupportedVersions...),
	}, nil
}

func validateDriverName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty driver name", ErrInvalidRegistration)
	}
	if len(name) > maxDriverNameLength {
		return fmt.Errorf("%w: driver name is %d characters long, the limit is %d", ErrInvalidRegistration, len(name), maxDriverNameLength)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%w: driver name %q is not a DNS-1123 subdomain: %s", ErrInvalidRegistration, name, strings.Join(errs, "; "))
	}
	return nil
}

// highestSupportedVersion returns the highest 1.x version in versions, as the
// kubelet's csi plugin does (versions before 1.0 are not supported).
func highestSupportedVersion(versions []string) (*utilversion.Version, error) {
	if len(versions) == 0 {
		return nil, fmt.Errorf("%w: no supported versions offered", ErrInvalidRegistration)
	}
	var highest *utilversion.Version
	for _, v := range versions {
		parsed, err := utilversion.ParseGeneric(v)
		if err != nil || parsed.Major() != 1 {
			continue
		}
		if highest == nil || parsed.GreaterThan(highest) {
			highest = parsed
		}
	}
	if highest == nil {
		return nil, fmt.Errorf("%w: none of the offered versions %q is a supported 1.x version", ErrInvalidRegistration, truncateList(versions))
	}
	return highest, nil
}

// validateEndpointPath accepts an absolute, clean path, optionally prefixed
// with "unix://", and returns the plain path.
func validateEndpointPath(endpoint string) (string, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	switch {
	case path == "":
		return "", fmt.Errorf("%w: empty endpoint", ErrInvalidRegistration)
	case !filepath.IsAbs(path):
		return "", fmt.Errorf("%w: endpoint %q is not an absolute path", ErrInvalidRegistration, truncate(endpoint))
	case filepath.Clean(path) != path:
		return "", fmt.Errorf("%w: endpoint %q is not a clean path", ErrInvalidRegistration, truncate(endpoint))
	case len(path) > maxUnixSocketPath:
		return "", fmt.Errorf("%w: endpoint path is %d bytes long, the unix socket limit is %d", ErrInvalidRegistration, len(path), maxUnixSocketPath)
	}
	return path, nil
}

// maxUnixSocketPath is the longest path a unix socket address can hold on Linux.
const maxUnixSocketPath = 107

// CheckEndpoint fails unless path exists and is a unix socket.
func CheckEndpoint(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: endpoint %q: %w", ErrInvalidRegistration, path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%w: endpoint %q is not a unix socket (mode %s)", ErrInvalidRegistration, path, fi.Mode())
	}
	return nil
}

// truncate keeps hostile strings from flooding log lines and events.
func truncate(s string) string {
	const limit = 128
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "...(truncated)"
}

func truncateList(list []string) []string {
	const limit = 8
	out := make([]string, 0, min(len(list), limit))
	for i, s := range list {
		if i == limit {
			out = append(out, "...")
			break
		}
		out = append(out, truncate(s))
	}
	return out
}
