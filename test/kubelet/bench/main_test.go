package bench_test

import (
	"testing"

	k8stest "github.com/csi-volmgr/csi-volmgr/test/k8s"
)

func TestMain(m *testing.M) { k8stest.Main(m, k8stest.Options{}) }
