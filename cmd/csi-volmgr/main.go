// Command csi-volmgr is the node agent that runs the CSI volume lifecycle for
// the pods of one node. All wiring lives in package app; main stays thin.
package main

import (
	"os"

	"github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app"
)

func main() {
	os.Exit(app.Execute())
}
