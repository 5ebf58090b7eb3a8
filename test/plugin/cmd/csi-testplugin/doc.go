// Command csi-testplugin runs the csi-volmgr test CSI plugin: real bind mounts and loop devices,
// state that survives restarts, a call journal and fault injection. Its flags map onto plugin.Config;
// package github.com/csi-volmgr/csi-volmgr/test/plugin documents the behaviour and the file formats.
package main
