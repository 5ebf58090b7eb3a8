// Package reconciler drives the actual state of world towards the desired
// state, event-driven: changes of the desired state, driver registrations,
// VolumeAttachment changes and the completion of steps enqueue keys on two
// rate-limited workqueues, and a periodic resync is the only timer.
//
// The volume queue (keys volume.Name) waits for attach and stages a wanted
// volume, and unstages a volume no pod wants once its last publish is gone.
// The pod queue (keys volume.PodKey) publishes a wanted use of a staged
// volume and unpublishes a use that is no longer wanted. Keys of one queue
// never run twice at once; lifecycle/operations serializes the steps of one
// volume (stage and unstage exclusive, publishes of different pods in
// parallel), so a slow publish for one pod never holds up another pod.
//
// Teardown waits until the desired state has synced: nothing is unpublished
// or unstaged on the word of a desired state that has not seen every pod
// yet. At that point, and at every resync, teardown keys are enqueued before
// setup keys, so unmounts go before mounts.
package reconciler
