// Package volume is the leaf vocabulary of the lifecycle: how volumes and
// their uses by pods are named, what the desired state says about them
// (Source, PodVolume), the states the actual state records (StageState,
// PublishState) and the sentinel errors every lifecycle package shares. It
// holds values only and imports nothing of the project.
package volume
