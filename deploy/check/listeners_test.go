package check

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The defaults of sluice serve's listen flags (cmd/sluice/listeners.go):
// decisions and usage on loopback, the probes and metrics everywhere.
const (
	defaultGRPC  = "127.0.0.1:8081"
	defaultHTTP  = "127.0.0.1:8080"
	defaultAdmin = ":8082"
)

// checkListeners checks who reaches a sluice serve pod (issue 35): its
// decisions (--grpc, --http) listen on loopback; the kubelet's probes and
// the scrape annotation use the admin listener (--admin-http), a port the
// container declares; and a NetworkPolicy selects the pod, admits the
// admin port and the gateway's listener, and admits no other port.
func (m *manifests) checkListeners(t *testing.T, where string, d *appsv1.Deployment, c *corev1.Container, flags map[string][]string) {
	t.Helper()
	flag := func(name, def string) string {
		if v := flags[name]; len(v) > 0 {
			return v[len(v)-1]
		}
		return def
	}
	for _, f := range []struct{ name, def string }{{"grpc", defaultGRPC}, {"http", defaultHTTP}} {
		host, _, err := net.SplitHostPort(flag(f.name, f.def))
		if a, perr := netip.ParseAddr(host); err != nil || perr != nil || !a.IsLoopback() {
			t.Errorf("%s: sluice serve --%s %s: decisions must listen on loopback, where only the pod's gateway reaches them", where, f.name, flag(f.name, f.def))
		}
	}
	_, adminPort, err := net.SplitHostPort(flag("admin-http", defaultAdmin))
	if err != nil || adminPort == "" || adminPort == "0" {
		t.Errorf("%s: sluice serve --admin-http %q: the probes and metrics need a port", where, flag("admin-http", defaultAdmin))
		return
	}
	spec := &d.Spec.Template.Spec
	ports := map[string]int32{} // container port names and numbers → numbers, every container's
	for _, ct := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, p := range ct.Ports {
			ports[p.Name] = p.ContainerPort
			ports[strconv.Itoa(int(p.ContainerPort))] = p.ContainerPort
		}
	}
	admin, _ := strconv.Atoi(adminPort)
	if ports[adminPort] != int32(admin) {
		t.Errorf("%s: the sluice container does not declare its admin port %s", where, adminPort)
	}
	for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: the sluice container lacks an HTTP probe", where)
			continue
		}
		if ports[p.HTTPGet.Port.String()] != int32(admin) {
			t.Errorf("%s: a probe of %s uses port %s, not the admin listener's %d: decisions are on loopback, out of the kubelet's reach", where, p.HTTPGet.Path, p.HTTPGet.Port.String(), admin)
		}
	}
	if p := d.Spec.Template.Annotations["prometheus.io/port"]; p != adminPort {
		t.Errorf("%s: prometheus.io/port %q, want the admin listener's %s", where, p, adminPort)
	}

	// The NetworkPolicy.
	var admitted []int32
	selected := false
	for _, np := range m.netpols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			continue
		}
		selected = true
		if !slices.Contains(np.Spec.PolicyTypes, "Ingress") {
			t.Errorf("%s: NetworkPolicy %s does not restrict ingress", where, np.Name)
		}
		for _, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 0 {
				t.Errorf("%s: NetworkPolicy %s admits every port to some peers", where, np.Name)
			}
			for _, p := range rule.Ports {
				if p.Port == nil {
					t.Errorf("%s: NetworkPolicy %s admits every port to some peers", where, np.Name)
					continue
				}
				n := resolvePort(*p.Port, ports)
				if n == 0 {
					t.Errorf("%s: NetworkPolicy %s admits port %s, which no container declares", where, np.Name, p.Port.String())
				}
				admitted = append(admitted, n)
			}
		}
	}
	if !selected {
		t.Errorf("%s: no NetworkPolicy selects the pods", where)
		return
	}
	_, grpcPort, _ := net.SplitHostPort(flag("grpc", defaultGRPC))
	_, httpPort, _ := net.SplitHostPort(flag("http", defaultHTTP))
	for _, p := range []string{grpcPort, httpPort} {
		n, _ := strconv.Atoi(p)
		if slices.Contains(admitted, int32(n)) {
			t.Errorf("%s: the NetworkPolicy admits the decisions' port %d", where, n)
		}
	}
	if !slices.Contains(admitted, int32(admin)) {
		t.Errorf("%s: the NetworkPolicy does not admit the admin port %d: Prometheus cannot scrape", where, admin)
	}
	for _, n := range admitted {
		if n != int32(admin) && ports["http"] != n {
			t.Errorf("%s: the NetworkPolicy admits port %d, neither the gateway's listener nor the admin port", where, n)
		}
	}
}

// resolvePort is a policy port's number: its own, or its name's among the
// pod's container ports; 0 if unknown.
func resolvePort(p intstr.IntOrString, ports map[string]int32) int32 {
	if p.Type == intstr.Int {
		return ports[strconv.Itoa(int(p.IntVal))]
	}
	return ports[p.StrVal]
}
