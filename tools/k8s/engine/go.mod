module miles.local/tools/k8s/engine

go 1.26.0
