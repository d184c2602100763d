package check

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/sluice-rl/sluice/rules"
)

const kubernetesDir = "../kubernetes"

// overlays are the kustomizations an operator applies, one per region.
var overlays = []string{"overlays/us-east", "overlays/eu-west"}

// manifests is one kustomize build decoded into typed objects.
type manifests struct {
	deployments map[string]*appsv1.Deployment
	configMaps  map[string]*corev1.ConfigMap
	services    map[string]*corev1.Service
	pdbs        map[string]*policyv1.PodDisruptionBudget
	hpas        map[string]*autoscalingv2.HorizontalPodAutoscaler
	netpols     map[string]*networkingv1.NetworkPolicy
}

// kubeDecoder decodes YAML strictly into the Kubernetes API's Go types: an
// unknown field, a duplicate field or a kind the scheme does not know is an
// error.
func kubeDecoder(t *testing.T) runtime.Decoder {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, autoscalingv2.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme, scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
}

// build runs kustomize on dir (as `kubectl apply -k` would) and decodes
// every object.
func build(t *testing.T, dec runtime.Decoder, dir string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), path.Join(kubernetesDir, dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	m := &manifests{map[string]*appsv1.Deployment{}, map[string]*corev1.ConfigMap{}, map[string]*corev1.Service{},
		map[string]*policyv1.PodDisruptionBudget{}, map[string]*autoscalingv2.HorizontalPodAutoscaler{}, map[string]*networkingv1.NetworkPolicy{}}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := dec.Decode(y, nil, nil)
		if err != nil {
			t.Errorf("%s: %s %s: %v", dir, r.GetKind(), r.GetName(), err)
			continue
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			m.deployments[o.Name] = o
		case *corev1.ConfigMap:
			m.configMaps[o.Name] = o
		case *corev1.Service:
			m.services[o.Name] = o
		case *policyv1.PodDisruptionBudget:
			m.pdbs[o.Name] = o
		case *autoscalingv2.HorizontalPodAutoscaler:
			m.hpas[o.Name] = o
		case *networkingv1.NetworkPolicy:
			m.netpols[o.Name] = o
		default:
			t.Errorf("%s: %T %s: a kind this test does not check", dir, obj, r.GetName())
		}
		if ns := r.GetNamespace(); ns != "sluice" {
			t.Errorf("%s: %s %s in namespace %q, want sluice", dir, r.GetKind(), r.GetName(), ns)
		}
	}
	return m
}

// configMap returns the ConfigMap whose generated name (with or without
// kustomize's hash suffix) is name.
func (m *manifests) configMap(name string) *corev1.ConfigMap {
	return m.configMaps[name]
}

// env returns the environment a container sees from its envFrom
// ConfigMaps and its env (a fieldRef reads as a placeholder value).
func (m *manifests) env(t *testing.T, where string, c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			t.Errorf("%s: envFrom without a ConfigMap", where)
			continue
		}
		cm := m.configMap(ef.ConfigMapRef.Name)
		if cm == nil {
			t.Errorf("%s: envFrom ConfigMap %s is not in the build", where, ef.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "pod-0"
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			// A Secret the operator makes (a password): never in the build,
			// so it must be optional, and no arg may name it.
			if o := e.ValueFrom.SecretKeyRef.Optional; o == nil || !*o {
				t.Errorf("%s: env %s from Secret %s, which is not in the build: make it optional", where, e.Name, e.ValueFrom.SecretKeyRef.Name)
			}
		case e.ValueFrom != nil:
			t.Errorf("%s: env %s from something other than a fieldRef", where, e.Name)
		default:
			env[e.Name] = e.Value
		}
	}
	return env
}

var kubeVar = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) in args as the kubelet does; a variable the
// container does not have is an error (the kubelet would pass it as is).
func expand(t *testing.T, where string, args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = kubeVar.ReplaceAllStringFunc(a, func(v string) string {
			name := v[2 : len(v)-1]
			val, ok := env[name]
			if !ok {
				t.Errorf("%s: %s names $(%s), which the container's environment lacks", where, a, name)
			}
			return val
		})
	}
	return out
}

// commandWord is a word of a command path in cobra's usage line ("sluice
// clickhouse sink --brokers HOST:PORT [flags]").
var commandWord = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// parseArgs parses a container's args with the real sluice command, as the
// binary would before running it, and returns the subcommand's flags. It
// runs the built binary on args with --help after them: cobra finds the
// subcommand (an unknown one is an error) and parses its flags (an unknown
// flag or a bad value is an error) before it honours --help, which then
// prints the help, whose usage line names the subcommand, instead of
// running it.
func parseArgs(t *testing.T, where string, args []string) map[string][]string {
	t.Helper()
	if slices.Contains(args, "--") {
		// After "--", --help would be an argument, and the command would run.
		t.Errorf("%s: args %q: no \"--\" please: sluice's commands take no arguments after their flags", where, args)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	run := exec.CommandContext(ctx, sluiceBinary(t), append(slices.Clone(args), "--help")...)
	run.Stdout, run.Stderr = &stdout, &stderr
	if err := run.Run(); err != nil {
		t.Errorf("%s: sluice rejects its args %q: %v: %s", where, args, err, strings.TrimSpace(stderr.String()))
		return nil
	}
	_, usage, _ := strings.Cut(stdout.String(), "Usage:\n")
	usage, _, _ = strings.Cut(usage, "\n")
	var path []string // "sluice", then the subcommand's path
	for _, w := range strings.Fields(usage) {
		if !commandWord.MatchString(w) {
			break
		}
		path = append(path, w)
	}
	if len(path) < 2 || path[0] != "sluice" {
		t.Errorf("%s: args %q: no sluice subcommand (usage %q)", where, args, usage)
		return nil
	}
	// rest is args without the subcommand's path, as cobra's Find strips it.
	rest := slices.Clone(args)
	for _, w := range path[1:] {
		if i := slices.Index(rest, w); i >= 0 {
			rest = slices.Delete(rest, i, i+1)
		}
	}
	// --help stops cobra before it validates the positional arguments.
	// Every long-running command (serve, pipeline, apply, clickhouse sink;
	// the switch below accepts no other) declares cobra.NoArgs, which
	// rejects any: so does this. (A "-x value" pair counts its value here.)
	name := path[len(path)-1]
	for _, a := range rest {
		if !strings.HasPrefix(a, "-") {
			t.Errorf("%s: sluice %s: unknown command %q: it takes no arguments", where, strings.Join(path[1:], " "), a)
			break
		}
	}
	flags := map[string][]string{"": {name}}
	for _, a := range rest {
		if name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
			flags[name] = append(flags[name], val)
		} else if strings.HasPrefix(a, "--") {
			t.Errorf("%s: arg %q: write --flag=value, so that the test and kubectl diff read one arg per flag", where, a)
		}
	}
	return flags
}

// releaseImage is the tag `make image` gives sluice's image:
// ghcr.io/sluice-rl/sluice:<the Makefile's VERSION>.
func releaseImage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION \?= (\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Makefile has no line VERSION ?= X")
	}
	return "ghcr.io/sluice-rl/sluice:" + string(m[1])
}

// sluiceContainer returns the pod's container running the sluice image
// (in containers or as a native sidecar in initContainers).
func sluiceContainer(d *appsv1.Deployment) *corev1.Container {
	spec := &d.Spec.Template.Spec
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			if strings.Contains(cs[i].Image, "sluice-rl/sluice") {
				return &cs[i]
			}
		}
	}
	return nil
}

// mountedFile returns the ConfigMap and key that a container's file path
// comes from.
func (m *manifests) mountedFile(t *testing.T, where string, d *appsv1.Deployment, c *corev1.Container, file string) (*corev1.ConfigMap, string) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil {
				cm := m.configMap(v.ConfigMap.Name)
				if cm == nil {
					t.Fatalf("%s: volume %s: ConfigMap %s is not in the build", where, v.Name, v.ConfigMap.Name)
				}
				return cm, rel
			}
		}
	}
	t.Fatalf("%s: no ConfigMap volume is mounted at %s", where, file)
	return nil, ""
}

// checkPod checks what every pod template needs: its selector matches it,
// probes and the scrape annotation name ports the container has, volumes
// name ConfigMaps in the build.
func (m *manifests) checkPod(t *testing.T, dir string, d *appsv1.Deployment) {
	where := dir + ": Deployment " + d.Name
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("%s: selector %v does not select its own pods (%v)", where, d.Spec.Selector, err)
	}
	spec := &d.Spec.Template.Spec
	ports := map[string]bool{}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, p := range c.Ports {
			ports[p.Name] = true
			ports[strconv.Itoa(int(p.ContainerPort))] = true
		}
		if c.Resources.Requests.Cpu().IsZero() {
			t.Errorf("%s: container %s has no CPU request: the HPA's utilization needs one", where, c.Name)
		}
		for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
			if p != nil && p.HTTPGet != nil && !ports[p.HTTPGet.Port.String()] {
				t.Errorf("%s: container %s probes port %s, which it does not declare", where, c.Name, p.HTTPGet.Port.String())
			}
		}
	}
	if p := d.Spec.Template.Annotations["prometheus.io/port"]; p == "" || !ports[p] {
		t.Errorf("%s: prometheus.io/port %q is not a container port", where, p)
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && m.configMap(v.ConfigMap.Name) == nil {
			t.Errorf("%s: volume %s: ConfigMap %s is not in the build", where, v.Name, v.ConfigMap.Name)
		}
	}
}

// checkEnvoy parses the gateway's Envoy bootstrap with go-control-plane's
// types (protojson: unknown fields and unknown typed_config types are
// errors), validates it, and checks that the rate limit filter asks the
// sidecar in the pod, over gRPC on localhost, with failure_mode_deny off. It
// returns the filter's domain, the sidecar's gRPC address, and what is wrong.
func checkEnvoy(src string) (domain, grpcAddr string, errs []error) {
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	j, err := yaml.YAMLToJSON([]byte(src))
	if err != nil {
		return "", "", []error{err}
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(j, &b); err != nil {
		return "", "", []error{err}
	}
	if err := b.ValidateAll(); err != nil {
		return "", "", []error{err}
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	found := 0
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				if n := len(hcm.GetHttpFilters()); n == 0 || hcm.GetHttpFilters()[n-1].GetName() != "envoy.filters.http.router" {
					bad("listener %s: the router is not the last HTTP filter", l.GetName())
				}
				for _, hf := range hcm.GetHttpFilters() {
					var rl ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&rl) != nil {
						continue
					}
					found++
					if rl.GetFailureModeDeny() {
						bad("failure_mode_deny is true: the gateway would deny every request while its sidecar restarts")
					}
					if v := rl.GetRateLimitService().GetTransportApiVersion().String(); v != "V3" {
						bad("rate_limit_service.transport_api_version %s, want V3", v)
					}
					cname := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
					c := clusters[cname]
					if c == nil {
						bad("the rate limit service's cluster %q is not defined (want envoy_grpc to a static cluster)", cname)
						continue
					}
					var hpo upstreamhttpv3.HttpProtocolOptions
					opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
					if opts == nil || opts.UnmarshalTo(&hpo) != nil || hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
						bad("cluster %s does not speak HTTP/2: gRPC needs it", cname)
					}
					eps := c.GetLoadAssignment().GetEndpoints()
					if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
						bad("cluster %s: want one endpoint, the sidecar", cname)
						continue
					}
					sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
					if ip := net.ParseIP(sa.GetAddress()); ip == nil || !ip.IsLoopback() {
						bad("cluster %s points at %s, not localhost: the sidecar is in the pod", cname, sa.GetAddress())
					}
					domain, grpcAddr = rl.GetDomain(), net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
				}
			}
		}
	}
	if found != 1 {
		bad("%d rate limit filters, want 1", found)
	}
	return domain, grpcAddr, errs
}

// TestKubernetesManifests builds every overlay with kustomize, decodes each
// object strictly into the Kubernetes API's Go types, and checks what
// matters: the gateway pod's Envoy asks its sluice sidecar over localhost
// gRPC with failure_mode_deny off; every sluice container's args are
// accepted by the real sluice command; the rules ConfigMap parses; PDBs and
// HPAs select and target the Deployments; the pipeline publishes for exactly
// the regions the overlays deploy.
func TestKubernetesManifests(t *testing.T) {
	dec := kubeDecoder(t)
	var deployedRegions, pipelineRegions []string
	for _, dir := range overlays {
		m := build(t, dec, dir)
		for _, want := range []string{"sluice-gateway", "sluice-apply"} {
			if m.deployments[want] == nil {
				t.Errorf("%s: no Deployment %s", dir, want)
			}
		}
		var region string
		for name, d := range m.deployments {
			where := dir + ": Deployment " + name
			m.checkPod(t, dir, d)
			c := sluiceContainer(d)
			if c == nil {
				t.Errorf("%s: no sluice container", where)
				continue
			}
			if want := releaseImage(t); c.Image != want {
				t.Errorf("%s: image %s, but make image tags %s (the Makefile's VERSION)", where, c.Image, want)
			}
			env := m.env(t, where, c)
			flags := parseArgs(t, where, expand(t, where, c.Args, env))
			if flags == nil {
				continue
			}
			if r := env["SLUICE_REGION"]; region == "" {
				region = r
			} else if r != region {
				t.Errorf("%s: region %s, another Deployment's is %s", where, r, region)
			}
			if f, ok := flags["rules"]; ok {
				cm, key := m.mountedFile(t, where, d, c, f[0])
				set, err := rules.Parse(dir+": ConfigMap "+cm.Name+": "+key, []byte(cm.Data[key]))
				if err != nil {
					t.Errorf("%v", err)
				} else if flags[""][0] == "serve" {
					envoyCM, envoyKey := m.mountedFile(t, where, d, &d.Spec.Template.Spec.Containers[0], "/etc/envoy/envoy.yaml")
					domain, addr, errs := checkEnvoy(envoyCM.Data[envoyKey])
					for _, err := range errs {
						t.Errorf("%s: ConfigMap %s: %s: %v", dir, envoyCM.Name, envoyKey, err)
					}
					if domain != set.Domain {
						t.Errorf("%s: Envoy sends domain %q, the rules are for %q: no rule would match", where, domain, set.Domain)
					}
					if g := flags["grpc"]; len(g) != 1 || g[0] != addr {
						t.Errorf("%s: sluice serve --grpc %v, Envoy's rate limit cluster is %s", where, g, addr)
					}
				}
			}
			switch cmd := flags[""][0]; cmd {
			case "serve":
				m.checkListeners(t, where, d, c, flags)
				if len(d.Spec.Template.Spec.InitContainers) != 1 || d.Spec.Template.Spec.InitContainers[0].RestartPolicy == nil ||
					*d.Spec.Template.Spec.InitContainers[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
					t.Errorf("%s: the sidecar should be a native sidecar (init container, restartPolicy Always), started before Envoy", where)
				}
				hpa := m.hpas[name]
				if hpa == nil || hpa.Spec.MinReplicas == nil || strconv.Itoa(int(*hpa.Spec.MinReplicas)) != flags["instances"][0] {
					t.Errorf("%s: --instances %v differs from its HPA's minReplicas", where, flags["instances"])
				}
			case "pipeline":
				role := flags["role"]
				if len(role) != 1 || "sluice-pipeline-"+role[0] != name {
					t.Errorf("%s: --role %v in Deployment %s", where, role, name)
				}
				if o := flags["output"]; len(o) != 1 || o[0] != "kafka" {
					t.Errorf("%s: --output %v: want kafka, applied by each region's sluice apply", where, o)
				}
				rs := slices.Sorted(slices.Values(flags["region"]))
				if pipelineRegions != nil && !slices.Equal(rs, pipelineRegions) {
					t.Errorf("%s: regions %v, the other tier's are %v", where, rs, pipelineRegions)
				}
				pipelineRegions = rs
				if role[0] == "partition" {
					hpa := m.hpas[name]
					parts, _ := strconv.Atoi(flags["partitions"][0])
					if hpa == nil || int(hpa.Spec.MaxReplicas) > parts {
						t.Errorf("%s: the HPA may scale past the %d partitions", where, parts)
					}
				}
			case "apply":
				if r := flags["region"]; len(r) != 1 || r[0] != env["SLUICE_REGION"] {
					t.Errorf("%s: --region %v, the region is %s", where, r, env["SLUICE_REGION"])
				}
			case "sink": // sluice clickhouse sink
				if c := flags["clickhouse"]; len(c) != 1 || c[0] != env["CLICKHOUSE_ADDR"] {
					t.Errorf("%s: --clickhouse %v, the endpoint is %s", where, c, env["CLICKHOUSE_ADDR"])
				}
			default:
				t.Errorf("%s: sluice %s is not a long-running process", where, cmd)
			}
		}
		deployedRegions = append(deployedRegions, region)
		for _, cm := range []string{"sluice-endpoints"} {
			c := m.configMaps[cm]
			if c == nil {
				// The generated name has a hash suffix.
				for name, x := range m.configMaps {
					if strings.HasPrefix(name, cm+"-") {
						c = x
					}
				}
			}
			if c == nil {
				t.Errorf("%s: no ConfigMap %s", dir, cm)
				continue
			}
			for _, k := range []string{"REDIS_ADDR", "KAFKA_BROKERS", "CLICKHOUSE_ADDR"} {
				if c.Data[k] == "" {
					t.Errorf("%s: ConfigMap %s has no %s", dir, c.Name, k)
				}
			}
		}
		m.checkPDBs(t, dir)
		m.checkHPAs(t, dir)
		m.checkServices(t, dir)
	}
	sort.Strings(deployedRegions)
	if !slices.Equal(deployedRegions, pipelineRegions) {
		t.Errorf("the pipeline publishes for regions %v, the overlays deploy %v", pipelineRegions, deployedRegions)
	}
}

// checkPDBs: each PDB selects the pods of exactly one Deployment, and every
// Deployment has one.
func (m *manifests) checkPDBs(t *testing.T, dir string) {
	covered := map[string]bool{}
	for name, p := range m.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("%s: PDB %s: selector %v (%v)", dir, name, p.Spec.Selector, err)
			continue
		}
		var hits []string
		for dn, d := range m.deployments {
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				hits = append(hits, dn)
				covered[dn] = true
			}
		}
		if len(hits) != 1 {
			t.Errorf("%s: PDB %s selects the pods of %v, want one Deployment", dir, name, hits)
		}
		if (p.Spec.MinAvailable == nil) == (p.Spec.MaxUnavailable == nil) {
			t.Errorf("%s: PDB %s: want exactly one of minAvailable and maxUnavailable", dir, name)
		}
	}
	for dn := range m.deployments {
		if !covered[dn] {
			t.Errorf("%s: Deployment %s has no PodDisruptionBudget", dir, dn)
		}
	}
}

// checkHPAs: each HPA targets a Deployment of the build, with sane bounds.
func (m *manifests) checkHPAs(t *testing.T, dir string) {
	for name, h := range m.hpas {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" || m.deployments[ref.Name] == nil {
			t.Errorf("%s: HPA %s targets %s %s %s, not a Deployment of this build", dir, name, ref.APIVersion, ref.Kind, ref.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas || len(h.Spec.Metrics) == 0 {
			t.Errorf("%s: HPA %s: want 2 <= minReplicas <= maxReplicas and a metric", dir, name)
		}
	}
	for _, want := range []string{"sluice-gateway", "sluice-pipeline-partition"} {
		if m.deployments[want] != nil && m.hpas[want] == nil {
			t.Errorf("%s: Deployment %s has no HPA", dir, want)
		}
	}
}

// checkServices: each Service selects pods of a Deployment and targets a
// port they declare.
func (m *manifests) checkServices(t *testing.T, dir string) {
	for name, s := range m.services {
		var d *appsv1.Deployment
		for _, x := range m.deployments {
			if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(x.Spec.Template.Labels)) {
				d = x
			}
		}
		if d == nil {
			t.Errorf("%s: Service %s selects no Deployment's pods", dir, name)
			continue
		}
		for _, p := range s.Spec.Ports {
			ok := false
			for _, c := range d.Spec.Template.Spec.Containers {
				for _, cp := range c.Ports {
					ok = ok || cp.Name == p.TargetPort.String() || strconv.Itoa(int(cp.ContainerPort)) == p.TargetPort.String()
				}
			}
			if !ok {
				t.Errorf("%s: Service %s port %s targets %s, which %s's containers do not declare", dir, name, p.Name, p.TargetPort.String(), d.Name)
			}
		}
	}
}

// TestKubernetesChecksFail: the decoding and the Envoy checks reject what
// they are there to reject.
func TestKubernetesChecksFail(t *testing.T) {
	dec := kubeDecoder(t)
	for name, y := range map[string]string{
		"unknown field":  "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n",
		"wrong type":     "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {minAvailable: [1]}\n",
		"unknown kind":   "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\n",
		"field in a pod": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: a, imag: b}]}}}\n",
	} {
		if _, _, err := dec.Decode([]byte(y), nil, nil); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
	b, err := os.ReadFile(path.Join(kubernetesDir, "gateway/envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	good := string(b)
	if _, _, errs := checkEnvoy(good); len(errs) > 0 {
		t.Fatalf("envoy.yaml: %v", errs)
	}
	for name, c := range map[string]struct{ from, to, want string }{
		"deny on failure": {"failure_mode_deny: false", "failure_mode_deny: true", "failure_mode_deny is true"},
		"remote sidecar":  {"socket_address: {address: 127.0.0.1, port_value: 8081}", "socket_address: {address: 10.0.0.9, port_value: 8081}", "not localhost"},
		"unknown field":   {"failure_mode_deny: false", "failure_mode_deny: false\n                      fail_open: true", "unknown field"},
		"no http2":        {"http2_protocol_options: {}", "http_protocol_options: {}", "HTTP/2"},
		"other cluster":   {"envoy_grpc: {cluster_name: sluice}\n                  - name", "envoy_grpc: {cluster_name: rls}\n                  - name", "not defined"},
	} {
		bad := strings.Replace(good, c.from, c.to, 1)
		if bad == good {
			t.Fatalf("%s: %q is not in envoy.yaml", name, c.from)
		}
		_, _, errs := checkEnvoy(bad)
		if !strings.Contains(fmt.Sprint(errs), c.want) {
			t.Errorf("%s: errors %v, want one containing %q", name, errs, c.want)
		}
	}
}
