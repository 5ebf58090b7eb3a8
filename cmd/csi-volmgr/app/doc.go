// Package app holds the csi-volmgr command line: the cobra commands and
// their flags. `run` turns its flags into a volumemanager.Config and runs
// the volume manager; `status` and `drivers` read its JSON status API.
// Nothing below cmd/ parses flags.
package app
