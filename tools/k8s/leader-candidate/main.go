// Command leader-candidate runs client-go's leader election on one coordination.k8s.io/v1 Lease
// and prints what it sees, one JSON object per line on stdout:
//
//	{"t": <unix seconds>, "id": "<identity>", "event": "<event>", "leader": "<observed holder>" | null}
//
// with event "leading" (OnStartedLeading), "stopped" (OnStoppedLeading), "new_leader"
// (OnNewLeader) or "acting" (every 100 ms while the OnStartedLeading context is not done), and
// leader the holder the elector last observed (GetLeader), null when none. After OnStoppedLeading
// it runs for election again under the same identity, until SIGTERM or SIGINT cancels the context:
// the lease is then released (ReleaseOnCancel) and the command exits 0.
//
//	leader-candidate --kubeconfig PATH --namespace NS --lease NAME --identity ID
//	    [--lease-duration S] [--renew-deadline S] [--retry-period S]
//
// The defaults are client-go's: 15 s, 10 s, 2 s. client-go does not fence: a candidate that
// resumes after a SIGSTOP keeps its OnStartedLeading context until its renew loop notices.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

const actingPeriod = 100 * time.Millisecond

type line struct {
	T      float64 `json:"t"`
	ID     string  `json:"id"`
	Event  string  `json:"event"`
	Leader *string `json:"leader"`
}

type printer struct {
	mu       sync.Mutex
	identity string
}

func (p *printer) emit(event string, leader string) {
	record := line{
		T:     float64(time.Now().UnixNano()) / 1e9,
		ID:    p.identity,
		Event: event,
	}
	if leader != "" {
		record.Leader = &leader
	}
	encoded, err := json.Marshal(record)
	if err != nil {
		panic(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := os.Stdout.Write(append(encoded, '\n')); err != nil {
		os.Exit(1)
	}
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second))
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the apiserver")
	namespace := flag.String("namespace", "", "namespace of the Lease")
	lease := flag.String("lease", "", "name of the Lease")
	identity := flag.String("identity", "", "this candidate's holderIdentity")
	leaseDuration := flag.Float64("lease-duration", 15, "LeaseDuration in seconds")
	renewDeadline := flag.Float64("renew-deadline", 10, "RenewDeadline in seconds")
	retryPeriod := flag.Float64("retry-period", 2, "RetryPeriod in seconds")
	flag.Parse()
	if *kubeconfig == "" || *namespace == "" || *lease == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "leader-candidate: --kubeconfig, --namespace, --lease and --identity are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leader-candidate: %v\n", err)
		os.Exit(2)
	}
	// The user agent names the writer in the Lease's managedFields.
	config.UserAgent = *identity
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "leader-candidate: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out := &printer{identity: *identity}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *lease},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	for ctx.Err() == nil {
		var elector *leaderelection.LeaderElector
		observed := func() string { return elector.GetLeader() }
		elector, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   seconds(*leaseDuration),
			RenewDeadline:   seconds(*renewDeadline),
			RetryPeriod:     seconds(*retryPeriod),
			ReleaseOnCancel: true,
			Name:            *lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(leading context.Context) {
					out.emit("leading", observed())
					ticker := time.NewTicker(actingPeriod)
					defer ticker.Stop()
					for {
						select {
						case <-leading.Done():
							return
						case <-ticker.C:
							if leading.Err() == nil {
								out.emit("acting", observed())
							}
						}
					}
				},
				OnStoppedLeading: func() { out.emit("stopped", observed()) },
				OnNewLeader:      func(holder string) { out.emit("new_leader", holder) },
			},
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "leader-candidate: %v\n", err)
			os.Exit(2)
		}
		// RunOrDie's own two steps, keeping the elector to read GetLeader.
		elector.Run(ctx)
	}
}
