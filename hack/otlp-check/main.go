// otlp-check decodes one OTLP/HTTP JSON export request (on stdin) with the OpenTelemetry
// collector's own decoder (go.opentelemetry.io/collector/pdata's ptrace.JSONUnmarshaler,
// what the collector's otlp receiver runs on an application/json body), and prints one
// JSON line: {"spans": N, "traces": [...], "services": [...]}. A body the collector would
// refuse exits 1 with the decoder's error. crates/pgop/tests/it/e2e_tracing.rs passes every
// body pgop's processes exported through it (hack/install-otlp-check.sh builds it).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"go.opentelemetry.io/collector/pdata/ptrace"
)

func main() {
	body, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "otlp-check: reading stdin:", err)
		os.Exit(2)
	}
	var decoder ptrace.JSONUnmarshaler
	traces, err := decoder.UnmarshalTraces(body)
	if err != nil {
		fmt.Fprintln(os.Stderr, "otlp-check: the collector's decoder refused the body:", err)
		os.Exit(1)
	}
	count := 0
	seenTraces := map[string]bool{}
	seenServices := map[string]bool{}
	resources := traces.ResourceSpans()
	for i := 0; i < resources.Len(); i++ {
		resource := resources.At(i)
		if name, ok := resource.Resource().Attributes().Get("service.name"); ok {
			seenServices[name.AsString()] = true
		}
		scopes := resource.ScopeSpans()
		for j := 0; j < scopes.Len(); j++ {
			spans := scopes.At(j).Spans()
			for k := 0; k < spans.Len(); k++ {
				span := spans.At(k)
				if span.TraceID().IsEmpty() || span.SpanID().IsEmpty() {
					fmt.Fprintln(os.Stderr, "otlp-check: a span without a trace or span id:", span.Name())
					os.Exit(1)
				}
				if span.EndTimestamp() < span.StartTimestamp() {
					fmt.Fprintln(os.Stderr, "otlp-check: a span that ends before it starts:", span.Name())
					os.Exit(1)
				}
				seenTraces[span.TraceID().String()] = true
				count++
			}
		}
	}
	keys := func(m map[string]bool) []string {
		out := make([]string, 0, len(m))
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	line, _ := json.Marshal(map[string]any{
		"spans":    count,
		"traces":   keys(seenTraces),
		"services": keys(seenServices),
	})
	fmt.Println(string(line))
}
