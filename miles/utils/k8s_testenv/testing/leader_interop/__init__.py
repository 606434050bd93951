"""client-go's leader election against ours on one Lease of a real apiserver, under faults.

Go counterpart: none; client-go's own `tools/leaderelection` (`tools/k8s/leader-candidate`) is one
of the contenders. `harness` runs the candidates behind their own TCP proxies and injects the
faults, `lease_watch` records the Lease, `analysis` checks the record and times the takeovers.
"""
