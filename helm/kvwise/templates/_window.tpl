{{/*
The size of the controller's statistics window, so that an install refuses settings the
controller would refuse at start (a crash loop): the same arithmetic as counter_bytes and
category_capacity in controlplane/fit/reuse_window.py, written again because a template
cannot call Python. tests/integration/test_helm_window_bound.py holds the two equal, on
both sides of every step, over a grid of values; change both together.
*/}}

{{/*
Categories the window has room for (category_capacity): maxCategories rounded up to a
power of two, at least 8. Takes the category count; gives a whole number.
*/}}
{{- define "kvwise.window.categoryRoom" -}}
{{- $room := 8.0 }}
{{- range until 64 }}
{{- if lt $room (float64 $) }}{{ $room = mulf $room 2 }}{{ end }}
{{- end }}
{{- printf "%.0f" $room }}
{{- end }}

{{/*
Gap bins of the window (window_edges, gap_edges): 2 + n, n the twentieths of a decade from
1 ms up to the reach (windowS plus one bucket, at least 10 ms), rounded up as gap_edges
rounds, which takes a reach within 1e-9 twentieth above an edge as that edge. Helm has no
logarithm: the whole decades are the reach's decimal exponent (in ms), the twentieths of
the last one the edges 10^((j + 1e-9) / 20) its mantissa passes. Takes controller.config.
*/}}
{{- define "kvwise.window.gapBins" -}}
{{- $reach := maxf (addf .windowS (divf .windowS .windowBuckets)) 0.01 }}
{{- $decimal := splitList "e" (printf "%.17e" (mulf $reach 1000)) }}
{{- $mantissa := float64 (first $decimal) }}
{{- $twentieths := mul 20 (atoi (last $decimal)) }}
{{- $edge := 1.0000000001151292 }}
{{- range until 20 }}
{{- if gt $mantissa $edge }}{{ $twentieths = add1 $twentieths }}{{ end }}
{{- $edge = mulf $edge 1.1220184543019633 }}
{{- end }}
{{- add 2 $twentieths }}
{{- end }}

{{/*
Bytes of the window's counters (counter_bytes): per bucket, per category of room two int64
counts and an int32 per gap bin, and two int64. Exact below 2^53 bytes (Helm's numbers are
float64). Takes controller.config; gives a whole number.
*/}}
{{- define "kvwise.window.counterBytes" -}}
{{- $room := include "kvwise.window.categoryRoom" .maxCategories | float64 }}
{{- $cell := addf 16 (mulf 4 (include "kvwise.window.gapBins" . | float64)) }}
{{- printf "%.0f" (mulf .windowBuckets (addf (mulf $room $cell) 16)) }}
{{- end }}

{{/* The controller's check _window_fits_its_bound, in the chart's value names. */}}
{{- define "kvwise.validate.window" -}}
{{- $config := .Values.controller.config }}
{{- $bytes := include "kvwise.window.counterBytes" $config | float64 }}
{{- if gt $bytes (float64 $config.maxWindowBytes) }}
{{- $room := include "kvwise.window.categoryRoom" $config.maxCategories }}
{{- fail (printf "controller.config.windowBuckets (%d) x controller.config.maxCategories (%d, room for %s) counter rows would size the statistics window at %.0f bytes (%.2f GiB) with controller.config.windowS=%v, more than controller.config.maxWindowBytes (%d), and the controller would refuse to start: lower windowBuckets or maxCategories, or raise maxWindowBytes (docs/fitting.md)" (int64 $config.windowBuckets) (int64 $config.maxCategories) $room $bytes (divf $bytes 1073741824) $config.windowS (int64 $config.maxWindowBytes)) }}
{{- end }}
{{- end }}
