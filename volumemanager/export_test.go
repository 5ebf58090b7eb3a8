package volumemanager

// SetServerLimits replaces the TCP endpoint's bounds of c, so that a test
// sees each fire in a moment.
func SetServerLimits(c *Config, l ServerLimits) { c.limits = &l }

// DefaultServerLimits are the TCP endpoint's bounds with maxConns
// connections (0: DefaultHTTPMaxConnections).
var DefaultServerLimits = defaultServerLimits
