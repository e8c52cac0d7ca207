"""The records that cross layers, typed: what an island reports and what a run's status holds.

An island writes its `Heartbeat`; syncd reads it for liveness, status and recovery. syncd
builds a run's `RunStatus`; the web app's API schema, its Prometheus metrics and the run
page's field list are generated from it, so nothing is written out twice by hand.
"""
