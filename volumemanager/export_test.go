package volumemanager

import "k8s.io/utils/clock"

// SetServerLimits replaces the TCP endpoint's bounds of c, so that a test
// sees each fire in a moment.
func SetServerLimits(c *Config, l ServerLimits) { c.limits = &l }

// SetServingCertClock gives the renewer of c's self-signed serving
// certificate a clock of the test's.
func SetServingCertClock(c *Config, clk clock.WithTicker) { c.servingCertClock = clk }

// DefaultServerLimits are the TCP endpoint's bounds with maxConns
// connections (0: DefaultHTTPMaxConnections).
var DefaultServerLimits = defaultServerLimits
