// bundle-validate checks an OLM bundle directory (manifests/ and metadata/) with the
// validation library of the Operator Framework, github.com/operator-framework/api: the
// library `operator-sdk bundle validate` runs. The operator-sdk module itself is not
// served by the Go module proxy this project builds from, so this small program calls
// the same validators directly:
//
//   - the default bundle validators (`operator-sdk bundle validate DIR`): the
//     ClusterServiceVersion, the CustomResourceDefinitions and the bundle as a whole
//     (owned CRDs present, no stray CRD, service accounts, size);
//   - the OperatorHub suite: operatorhub/v2, standardcapabilities and
//     standardcategories, which the library names as the equivalent of the deprecated
//     "operatorhub" validator that `--select-optional name=operatorhub` selects;
//   - good-practices and alpha-deprecated-apis, which operator-sdk also offers as
//     optional validators, the latter against --k8s-version;
//   - and metadata/annotations.yaml's bundle keys, which operator-sdk checks through
//     operator-registry (not built here): mediatype registry+v1, the manifests/ and
//     metadata/ directories, a package and its channels.
//
// Every finding is printed with its level. The exit status is 1 when any finding is an
// error, and also when any is a warning unless --allow-warnings is given; 2 when the
// bundle cannot be read.
//
// --print-csv-crd prints OLM's ClusterServiceVersion CustomResourceDefinition as this
// library version has it (YAML), so that a test can have a real API server check a CSV
// against OLM's schema.
//
//	bundle-validate [--k8s-version 1.34] [--allow-warnings] DIR
//	bundle-validate --print-csv-crd
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/operator-framework/api/crds"
	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
	interfaces "github.com/operator-framework/api/pkg/validation/interfaces"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

type suite struct {
	name       string
	validators interfaces.Validators
}

func main() {
	k8sVersion := flag.String("k8s-version", "", "the Kubernetes version (MAJOR.MINOR) alpha-deprecated-apis checks removed APIs against; empty: warn about every deprecated API")
	allowWarnings := flag.Bool("allow-warnings", false, "exit 0 when there are warnings but no errors")
	printCSVCRD := flag.Bool("print-csv-crd", false, "print OLM's ClusterServiceVersion CRD (YAML) and exit")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [--k8s-version X.Y] [--allow-warnings] BUNDLE_DIR\n       %s --print-csv-crd\n", os.Args[0], os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if *printCSVCRD && flag.NArg() == 0 {
		crd := crds.ClusterServiceVersion()
		crd.Status = apiextensionsv1.CustomResourceDefinitionStatus{}
		out, err := yaml.Marshal(crd)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR: %v\n", err)
			os.Exit(2)
		}
		os.Stdout.Write(out)
		return
	}
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)

	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR: cannot load the bundle in %s: %v\n", dir, err)
		os.Exit(2)
	}

	optional := map[string]string{}
	if *k8sVersion != "" {
		optional["k8s-version"] = *k8sVersion
	}
	objects := append(bundle.ObjectsToValidate(), optional)

	suites := []suite{
		{"default", validation.DefaultBundleValidators},
		{"operatorhub/v2", interfaces.Validators{validation.OperatorHubV2Validator}},
		{"standardcapabilities", interfaces.Validators{validation.StandardCapabilitiesValidator}},
		{"standardcategories", interfaces.Validators{validation.StandardCategoriesValidator}},
		{"good-practices", interfaces.Validators{validation.GoodPracticesValidator}},
		{"alpha-deprecated-apis", interfaces.Validators{validation.AlphaDeprecatedAPIsValidator}},
	}

	var nErrors, nWarnings int
	report := func(suite, name string, e errors.Error) {
		if name == "" {
			name = "-"
		}
		fmt.Printf("%s\t[%s]\t%s\t%s\n", strings.ToLower(string(e.Level)), suite, name, e.Error())
		if e.Level == errors.LevelError {
			nErrors++
		} else {
			nWarnings++
		}
	}
	for _, s := range suites {
		for _, result := range s.validators.Validate(objects...) {
			for _, e := range result.Errors {
				report(s.name, result.Name, e)
			}
			for _, e := range result.Warnings {
				report(s.name, result.Name, e)
			}
		}
	}
	for _, e := range checkAnnotations(filepath.Join(dir, "metadata", "annotations.yaml")) {
		report("annotations", "metadata/annotations.yaml", e)
	}

	fmt.Printf("bundle %s (%s): %d error(s), %d warning(s)\n", dir, bundle.Name, nErrors, nWarnings)
	if nErrors > 0 || (nWarnings > 0 && !*allowWarnings) {
		os.Exit(1)
	}
}

// checkAnnotations checks the bundle keys of metadata/annotations.yaml: the ones OLM
// reads to unpack a registry+v1 bundle.
func checkAnnotations(path string) []errors.Error {
	fail := func(field string, value interface{}, detail string) errors.Error {
		return errors.Error{Type: errors.ErrorInvalidBundle, Level: errors.LevelError, Field: field, BadValue: value, Detail: detail}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return []errors.Error{fail("", path, fmt.Sprintf("cannot read: %v", err))}
	}
	var file struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.UnmarshalStrict(data, &file); err != nil {
		return []errors.Error{fail("", path, fmt.Sprintf("not a YAML map with one key `annotations`: %v", err))}
	}
	want := map[string]string{
		"operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
		"operators.operatorframework.io.bundle.manifests.v1": "manifests/",
		"operators.operatorframework.io.bundle.metadata.v1":  "metadata/",
	}
	var errs []errors.Error
	keys := make([]string, 0, len(want))
	for key := range want {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		if got, ok := file.Annotations[key]; !ok {
			errs = append(errs, fail("annotations."+key, nil, fmt.Sprintf("missing; expected %q", want[key])))
		} else if got != want[key] {
			errs = append(errs, fail("annotations."+key, got, fmt.Sprintf("expected %q", want[key])))
		}
	}
	for _, key := range []string{
		"operators.operatorframework.io.bundle.package.v1",
		"operators.operatorframework.io.bundle.channels.v1",
	} {
		if file.Annotations[key] == "" {
			errs = append(errs, fail("annotations."+key, nil, "missing or empty"))
		}
	}
	return errs
}
