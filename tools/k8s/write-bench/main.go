// write-bench: client-go's typed client writing ConfigMaps as fast as the apiserver takes them,
// the Go side of bench/writes.py.
//
// It runs one operation for -seconds with -concurrency goroutines, each writing its own ConfigMap
// (bench-<worker>) so that no two writers conflict: "patch" (a merge patch of data.v), "apply"
// (server-side apply of data.v, field manager "bench", force) or "create-delete" (a create of a
// new name, then its delete: two writes). The client-side rate limiter is off (QPS -1, as
// controller-runtime's config sets it). It prints one JSON line:
//
//	{"writes": N, "errors": N, "seconds": wall, "cpu_seconds": user+system of this process}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "namespace of the ConfigMaps")
	op := flag.String("op", "patch", "patch, apply or create-delete")
	concurrency := flag.Int("concurrency", 16, "writes in flight")
	seconds := flag.Float64("seconds", 5, "how long to write")
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	config.QPS = -1
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail(err)
	}
	maps := clientset.CoreV1().ConfigMaps(*namespace)

	var writes, errors atomic.Int64
	deadline := time.Now().Add(time.Duration(*seconds * float64(time.Second)))
	cpuBefore := cpuSeconds()
	started := time.Now()
	var wg sync.WaitGroup
	for worker := range *concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("bench-%d", worker)
			for seq := 0; time.Now().Before(deadline); seq++ {
				n, err := write(maps, *op, name, seq)
				writes.Add(int64(n))
				if err != nil {
					errors.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(started).Seconds()
	out, _ := json.Marshal(map[string]any{
		"writes": writes.Load(), "errors": errors.Load(), "seconds": wall,
		"cpu_seconds": cpuSeconds() - cpuBefore,
	})
	fmt.Println(string(out))
}

func write(maps typedcorev1.ConfigMapInterface, op, name string, seq int) (int, error) {
	ctx := context.Background()
	value := fmt.Sprintf("%d", seq)
	switch op {
	case "patch":
		body := []byte(fmt.Sprintf(`{"data":{"v":%q}}`, value))
		_, err := maps.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
		return done(err)
	case "apply":
		desired := corev1ac.ConfigMap(name, "").WithData(map[string]string{"v": value})
		options := metav1.ApplyOptions{FieldManager: "bench", Force: true}
		_, err := maps.Apply(ctx, desired, options)
		return done(err)
	case "create-delete":
		fresh := fmt.Sprintf("%s-%d", name, seq)
		created := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fresh}}
		if _, err := maps.Create(ctx, created, metav1.CreateOptions{}); err != nil {
			return 0, err
		}
		if err := maps.Delete(ctx, fresh, metav1.DeleteOptions{}); err != nil {
			return 1, err
		}
		return 2, nil
	}
	fail(fmt.Errorf("unknown op %q", op))
	return 0, nil
}

func done(err error) (int, error) {
	if err != nil {
		return 0, err
	}
	return 1, nil
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		fail(err)
	}
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "write-bench:", err)
	os.Exit(2)
}
