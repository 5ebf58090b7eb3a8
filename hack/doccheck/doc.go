// Package doccheck holds the tests that keep the repository's Markdown
// true: every relative link and anchor leads somewhere, and every `make`
// target the text names exists in the Makefile. It has no code of its own.
package doccheck
