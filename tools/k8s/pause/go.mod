module miles.local/tools/k8s/pause

go 1.26.0
