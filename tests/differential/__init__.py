"""Differential test of our scheduler against kube-scheduler (issue #13): seeded random small
clusters and workloads, run through both on one control plane, checked by an independent
checker of Kubernetes' placement rules. See :mod:`tests.differential.run`."""
