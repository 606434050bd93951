// Command oracle runs client-go's Reflector and Store for pods, or with --resource for any
// resource as client-go's dynamic informer does (dynamicinformer.NewFilteredDynamicInformer: the
// dynamic client's List and Watch, unstructured.Unstructured objects), and prints the store on
// request.
//
// For every line read on stdin it writes one JSON line to stdout:
//
//	{"resourceVersion": "<LastSyncResourceVersion>", "lists": N, "pods": [{"name", "uid", "resourceVersion", "labels"}, ...]}
//
// with the objects (pods, or the resource's) under "pods" whatever their kind, sorted by name, and N the number of listings made so far: LIST requests (a paginated
// LIST counts once) and, with --watch-list, watch-list streams. A line that is exactly "progress"
// gets the cheap form instead, without the pods:
//
//	{"resourceVersion": "<LastSyncResourceVersion>", "lists": N, "events": E, "size": S}
//
// with E the watch events applied to the store so far (Add, Update, Delete) and S the pods it
// holds. It exits when stdin closes. The WatchListClient feature is off unless --watch-list is set,
// so by default the Reflector does LIST then WATCH.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

type podView struct {
	Name            string            `json:"name"`
	UID             string            `json:"uid"`
	ResourceVersion string            `json:"resourceVersion"`
	Labels          map[string]string `json:"labels"`
}

type progress struct {
	ResourceVersion string `json:"resourceVersion"`
	Lists           int64  `json:"lists"`
	Events          int64  `json:"events"`
	Size            int    `json:"size"`
}

// countingStore is a cache.Store that counts the watch events applied to it.
type countingStore struct {
	cache.Store
	events atomic.Int64
}

func (s *countingStore) Add(obj interface{}) error {
	s.events.Add(1)
	return s.Store.Add(obj)
}

func (s *countingStore) Update(obj interface{}) error {
	s.events.Add(1)
	return s.Store.Update(obj)
}

func (s *countingStore) Delete(obj interface{}) error {
	s.events.Add(1)
	return s.Store.Delete(obj)
}

type snapshot struct {
	ResourceVersion string    `json:"resourceVersion"`
	Lists           int64     `json:"lists"`
	Pods            []podView `json:"pods"`
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to the kubeconfig")
	namespace := flag.String("namespace", "", "namespace to watch (empty: all namespaces)")
	selector := flag.String("selector", "", "label selector")
	watchList := flag.Bool("watch-list", false, "use the streaming WatchList client instead of LIST+WATCH")
	resource := flag.String("resource", "", "GROUP/VERSION/RESOURCE to watch as the dynamic informer does (empty: pods, typed)")
	flag.Parse()

	// client-go reads KUBE_FEATURE_* lazily, on the first feature-gate lookup.
	if err := os.Setenv("KUBE_FEATURE_WatchListClient", strconv.FormatBool(*watchList)); err != nil {
		fail(err)
	}
	if err := run(*kubeconfig, *namespace, *selector, *resource); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "oracle:", err)
	os.Exit(1)
}

func run(kubeconfig, namespace, selector, resource string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	var lists atomic.Int64
	var lw cache.ListerWatcher
	var expected runtime.Object
	if resource == "" {
		clientset, err := kubernetes.NewForConfig(config)
		if err != nil {
			return err
		}
		lw, expected = countingListWatch(clientset, namespace, selector, &lists), &corev1.Pod{}
	} else {
		gvr, err := parseResource(resource)
		if err != nil {
			return err
		}
		client, err := dynamic.NewForConfig(config)
		if err != nil {
			return err
		}
		lw = dynamicListWatch(client, gvr, namespace, selector, &lists)
		expected = &unstructured.Unstructured{}
	}
	store := &countingStore{Store: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	reflector := cache.NewReflectorWithOptions(lw, expected, store, cache.ReflectorOptions{Name: "oracle"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go reflector.RunWithContext(ctx)

	out := json.NewEncoder(os.Stdout)
	stdin := bufio.NewScanner(os.Stdin)
	for stdin.Scan() {
		var answer any
		if stdin.Text() == "progress" {
			answer = progressOf(reflector, store, &lists)
		} else {
			answer = snapshotOf(reflector, store, &lists)
		}
		if err := out.Encode(answer); err != nil {
			return err
		}
	}
	return stdin.Err()
}

func parseResource(text string) (schema.GroupVersionResource, error) {
	parts := strings.Split(text, "/")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return schema.GroupVersionResource{}, fmt.Errorf("--resource %q is not GROUP/VERSION/RESOURCE", text)
	}
	return schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}, nil
}

// dynamicListWatch is dynamicinformer.NewFilteredDynamicInformer's ListerWatcher (client-go
// v0.36 dynamic/dynamicinformer/informer.go), with the same listing count as countingListWatch.
func dynamicListWatch(
	client dynamic.Interface, gvr schema.GroupVersionResource, namespace, selector string, lists *atomic.Int64,
) cache.ListerWatcher {
	objects := client.Resource(gvr).Namespace(namespace)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			if o.Continue == "" {
				lists.Add(1)
			}
			return objects.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				lists.Add(1) // a watch-list stream is this client's listing
			}
			return objects.Watch(ctx, o)
		},
	}, client)
}

func countingListWatch(
	clientset kubernetes.Interface, namespace, selector string, lists *atomic.Int64,
) *cache.ListWatch {
	lw := cache.NewFilteredListWatchFromClient(
		clientset.CoreV1().RESTClient(), "pods", namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = selector },
	)
	list := lw.ListWithContextFunc
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		if o.Continue == "" {
			lists.Add(1)
		}
		return list(ctx, o)
	}
	openWatch := lw.WatchFuncWithContext
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		if o.SendInitialEvents != nil && *o.SendInitialEvents {
			lists.Add(1) // a watch-list stream is this client's listing
		}
		return openWatch(ctx, o)
	}
	return lw
}

func progressOf(reflector *cache.Reflector, store *countingStore, lists *atomic.Int64) progress {
	return progress{
		ResourceVersion: reflector.LastSyncResourceVersion(),
		Lists:           lists.Load(),
		Events:          store.events.Load(),
		Size:            len(store.ListKeys()),
	}
}

func snapshotOf(reflector *cache.Reflector, store cache.Store, lists *atomic.Int64) snapshot {
	pods := []podView{}
	for _, obj := range store.List() {
		object, err := meta.Accessor(obj)
		if err != nil {
			fail(err)
		}
		labels := object.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		pods = append(pods, podView{
			Name:            object.GetName(),
			UID:             string(object.GetUID()),
			ResourceVersion: object.GetResourceVersion(),
			Labels:          labels,
		})
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	return snapshot{
		ResourceVersion: reflector.LastSyncResourceVersion(),
		Lists:           lists.Load(),
		Pods:            pods,
	}
}
