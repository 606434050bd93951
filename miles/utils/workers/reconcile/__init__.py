"""A level-triggered controller runtime for asyncio, after client-go and controller-runtime.

Go: client-go's ``tools/cache`` informer stack and controller-runtime's ``pkg/`` (CR below).

The map, lowest layer first. A module imports only from its own layer or lower ones; the command
and the examples sit on top. ``lint-imports`` checks this (the contracts are in
``pyproject.toml``, each exception there with its reason in ``docs/reconcile-loop.md``).

1. Vocabulary: the values and small rules everything else speaks.
   ``clock`` (``k8s.io/utils/clock``), ``source_event`` (``watch.Event``), ``status`` (none: what a
   person reads), ``resource`` (``schema.GroupVersionResource``), ``arguments`` (none: constructor
   checks), ``backoff`` (``wait.Backoff``), ``log`` (klog's named loggers), ``tasks`` (a
   ``select`` over channels), ``result`` (CR's ``reconcile.Result`` and ``TerminalError``),
   ``metrics_provider`` (workqueue's ``MetricsProvider``).
2. Core machinery: the informer and the controller, with no Kubernetes in them.
   ``object_store`` (``cache.Store`` and its indexer), ``work_queue`` (``workqueue``),
   ``retry_scheduler`` (the rate limiter and delaying queue), ``source_stream_driver`` (the
   informer's ``Run``/``processLoop``), ``own_writes`` (kube-controller-manager's consistency
   store), ``loop`` (CR's internal ``Controller``: the lifecycle, the worker, resync),
   ``watches`` (CR's ``Controller.Watch``: several sources of one loop), ``owner_key_map`` (CR's
   ``EnqueueRequestForOwner``).
3. Kubernetes adapter: the apiserver's wire, objects and errors.
   ``k8s_reflector`` (``cache.Reflector``), ``k8s_api`` (the typed clients over
   ``kubernetes_asyncio``, the only module that imports it), ``k8s_config`` (``tools/clientcmd``,
   ``rest.InClusterConfig``: kubeconfig, service account, token refresh), ``k8s_transport``
   (``rest``'s HTTP client), ``k8s_http`` (``net/http``'s ``Transport``, HTTP/1.1),
   ``k8s_http2`` (``x/net/http2``'s ``Transport``), ``k8s_hpack`` (``x/net/http2/hpack``),
   ``k8s_interfaces`` (``cache.ListerWatcher``), ``k8s_values``
   (``PodList``, ``watch.Event``), ``k8s_types`` (core/v1 and batch/v1 types), ``k8s_objects``
   (``metav1.Object``, ``unstructured.Unstructured``), ``k8s_errors`` (``apierrors``),
   ``k8s_wire`` (``watch.Decoder``), ``k8s_framing`` (``util/framer``), ``k8s_pager``
   (``tools/pager``), ``k8s_watch_health`` (http2's health check), ``informer/`` (client-go's
   ``SharedIndexInformer`` and ``SharedInformerFactory``: one watch and store for many loops);
   their helpers
   ``managed_fields``, ``item_runs``, ``list_memory``, ``gc_pause``, ``heap_trim`` (none in Go:
   decoding and memory in Python).
4. Process: what a controller binary adds around its loops, one package per concept.
   ``leaderelection/`` (client-go's ``tools/leaderelection``), ``metrics`` (CR's controller and
   workqueue metrics, on Prometheus), ``manager/`` (CR's ``pkg/manager``, ``pkg/healthz``,
   ``pkg/metrics/server``), ``client/`` (CR's ``pkg/client``), ``events/`` (client-go's
   ``tools/record``), ``controllerutil/`` (CR's ``pkg/controller/controllerutil``: finalizers,
   owner references).
5. ``cli/`` (``miles-reconcile``, kubectl's shape) and ``examples/`` (kubebuilder's ``main.go``).

The original's users import these module paths, and they stay where they are:
``miles.utils.workers.reconcile.clock``, ``.source_event``, ``.object_store``, ``.work_queue``,
``.retry_scheduler``, ``.source_stream_driver``, ``.loop``, ``.k8s_types``, ``.k8s_api``,
``.k8s_reflector``, and ``miles.utils.workers.k8s_types``.

Where to start reading: ``loop.py`` (one ``ReconcileLoop``: what it asks of a source and a
``reconcile``), then ``k8s_reflector.py`` (the source a cluster gives it), ``object_store.py`` and
``work_queue.py``; ``examples/pod_counter.py`` puts them in a program. ``docs/reconcile-loop.md``
records every choice against the Go originals, module by module.
"""
