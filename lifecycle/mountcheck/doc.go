// Package mountcheck keeps pods' mounts alive across restarts of their CSI
// node plugins: when a driver registers again (and periodically for the
// drivers configured so), it verifies every staged and published mount of
// the driver and sets up again the broken ones, without unmounting a
// healthy mount. See Checker.
package mountcheck
