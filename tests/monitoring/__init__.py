"""What the monitoring tests share: the chart's dashboard and alert rules, the PromQL in them
(parsed by promql-parser), and the metrics a scheduler really exports (:mod:`.assets`)."""
