package envdoc

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Manifest is what a Kubernetes manifest says of each binary's pods.
type Manifest struct {
	// Containers of the Deployments and Jobs, by name (the binary's, or
	// migrate: exportctl's).
	Containers map[string]Container
	Services   map[string]Service // by name
	// PolicyPorts are, per app label, the ports its NetworkPolicies let in.
	PolicyPorts map[string][]int
	// Deployments are the Deployments, by name.
	Deployments map[string]Deployment
	// Autoscalers are the HorizontalPodAutoscalers, by name.
	Autoscalers map[string]Autoscaler
}

// Deployment is what the checks read of a Deployment besides its pods.
type Deployment struct {
	// Replicas is spec.replicas, nil when the manifest leaves it out.
	Replicas *int
}

// Autoscaler is a HorizontalPodAutoscaler: what it scales.
type Autoscaler struct {
	TargetKind, TargetName string // spec.scaleTargetRef
}

// Container is one binary's container.
type Container struct {
	Env        map[string]string // env and envFrom, secrets resolved
	Ports      []int             // containerPort
	Probes     map[string]Probe  // by kind: readiness, liveness, startup
	ScrapePort string            // the pod's prometheus.io/port annotation
	// GracePeriod is the pod's terminationGracePeriodSeconds (Kubernetes'
	// default, 30 s, when left out): from the pod's deletion to SIGKILL,
	// the preStop hook's time included.
	GracePeriod time.Duration
	// PreStopSleep is the container's lifecycle.preStop.sleep (0 without
	// one): how long it serves on, out of its Service's endpoints, before
	// Kubernetes sends SIGTERM.
	PreStopSleep time.Duration
	// MemoryRequest and MemoryLimit are resources.requests.memory and
	// resources.limits.memory in bytes, 0 when left out.
	MemoryRequest, MemoryLimit int64
}

// defaultGracePeriod is Kubernetes' terminationGracePeriodSeconds when a
// pod leaves it out.
const defaultGracePeriod = 30 * time.Second

// Probe is an httpGet probe.
type Probe struct {
	Path string
	Port int
}

// Service is a Kubernetes Service: its app selector and ports.
type Service struct {
	App   string
	Ports []ServicePort
}

// ServicePort is one port of a Service; Target is Port when not given.
type ServicePort struct{ Port, Target int }

// ReadManifest reads a multi-document Kubernetes manifest. The values of
// secretKeyRef come from secrets, by key (what an operator puts in the
// Secret); an optional key secrets lacks leaves its variable unset.
func ReadManifest(path string, secrets map[string]string) (*Manifest, error) {
	docs, err := readDocuments(path)
	if err != nil {
		return nil, err
	}
	configMaps := map[string]map[string]string{}
	for _, d := range docs {
		if d.Kind == "ConfigMap" {
			configMaps[d.Metadata.Name] = d.Data
		}
	}
	m := &Manifest{Containers: map[string]Container{}, Services: map[string]Service{}, PolicyPorts: map[string][]int{},
		Deployments: map[string]Deployment{}, Autoscalers: map[string]Autoscaler{}}
	for _, d := range docs {
		if err := m.add(d, configMaps, secrets); err != nil {
			return nil, fmt.Errorf("%s: %s %s: %w", path, d.Kind, d.Metadata.Name, err)
		}
	}
	return m, nil
}

// object is the part of any Kubernetes object the checks read.
type object struct {
	Kind     string
	Metadata struct {
		Name string
	}
	Data map[string]string // ConfigMap
	node yaml.Node
}

func readDocuments(path string) ([]object, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var docs []object
	dec := yaml.NewDecoder(f)
	for {
		var o object
		if err := dec.Decode(&o.node); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := o.node.Decode(&o); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		docs = append(docs, o)
	}
}

func (m *Manifest) add(d object, configMaps map[string]map[string]string, secrets map[string]string) error {
	switch d.Kind {
	case "Deployment":
		var dep struct {
			Spec struct{ Replicas *int }
		}
		if err := d.node.Decode(&dep); err != nil {
			return err
		}
		m.Deployments[d.Metadata.Name] = Deployment{Replicas: dep.Spec.Replicas}
		return m.addPods(d, configMaps, secrets)
	case "Job": // the same pod template as a Deployment's
		return m.addPods(d, configMaps, secrets)
	case "HorizontalPodAutoscaler":
		var hpa struct {
			Spec struct {
				ScaleTargetRef struct{ Kind, Name string } `yaml:"scaleTargetRef"`
			}
		}
		if err := d.node.Decode(&hpa); err != nil {
			return err
		}
		m.Autoscalers[d.Metadata.Name] = Autoscaler{TargetKind: hpa.Spec.ScaleTargetRef.Kind, TargetName: hpa.Spec.ScaleTargetRef.Name}
	case "Service":
		var s struct {
			Spec struct {
				Selector map[string]string
				Ports    []struct {
					Port       int
					TargetPort int `yaml:"targetPort"`
				}
			}
		}
		if err := d.node.Decode(&s); err != nil {
			return err
		}
		svc := Service{App: s.Spec.Selector["app"]}
		for _, p := range s.Spec.Ports {
			svc.Ports = append(svc.Ports, ServicePort{Port: p.Port, Target: cmp.Or(p.TargetPort, p.Port)})
		}
		m.Services[d.Metadata.Name] = svc
	case "NetworkPolicy":
		return m.addPolicy(d)
	}
	return nil
}

// envVar is an entry of a container's env: a value, or a Secret's key.
type envVar struct {
	Name      string
	Value     *string
	ValueFrom *struct {
		SecretKeyRef struct {
			Key      string
			Optional bool
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

// envFromSource is an entry of a container's envFrom: every key of a
// ConfigMap.
type envFromSource struct {
	ConfigMapRef struct{ Name string } `yaml:"configMapRef"`
}

// containerEnv is a container's environment as Kubernetes makes it: the
// keys of its envFrom ConfigMaps (configMaps, by name), then its env
// entries over them. A Secret's key takes its value from secrets (the
// sample values); an optional one without a value is left unset.
func containerEnv(env []envVar, envFrom []envFromSource, configMaps map[string]map[string]string, secrets map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for _, from := range envFrom {
		data, ok := configMaps[from.ConfigMapRef.Name]
		if !ok {
			return nil, fmt.Errorf("no ConfigMap %s", from.ConfigMapRef.Name)
		}
		maps.Copy(out, data)
	}
	for _, e := range env { // env wins over envFrom, as in Kubernetes
		switch {
		case e.Value != nil:
			out[e.Name] = *e.Value
		case e.ValueFrom != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Key]
			if !ok && !ref.Optional {
				return nil, fmt.Errorf("%s: no sample value for secret key %s", e.Name, ref.Key)
			}
			if ok {
				out[e.Name] = v
			}
		}
	}
	return out, nil
}

type httpProbe struct {
	HTTPGet struct {
		Path string
		Port int
	} `yaml:"httpGet"`
}

// podOwner is what addPods reads of an object that owns a pod template
// (a Deployment, a Job).
type podOwner struct {
	Spec struct {
		Template struct {
			Metadata struct{ Annotations map[string]string }
			Spec     struct {
				TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
				Containers                    []podContainer
			}
		}
	}
}

// podContainer is what addPods reads of one container of a pod template.
type podContainer struct {
	Name    string
	Env     []envVar
	EnvFrom []envFromSource `yaml:"envFrom"`
	Ports   []struct {
		ContainerPort int `yaml:"containerPort"`
	}
	ReadinessProbe *httpProbe `yaml:"readinessProbe"`
	LivenessProbe  *httpProbe `yaml:"livenessProbe"`
	StartupProbe   *httpProbe `yaml:"startupProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep struct{ Seconds int }
		} `yaml:"preStop"`
	}
	Resources struct {
		Requests, Limits struct{ Memory string }
	}
}

// addPods adds the containers of a pod template.
func (m *Manifest) addPods(d object, configMaps map[string]map[string]string, secrets map[string]string) error {
	var owner podOwner
	if err := d.node.Decode(&owner); err != nil {
		return err
	}
	pod := owner.Spec.Template
	gracePeriod := defaultGracePeriod
	if s := pod.Spec.TerminationGracePeriodSeconds; s != nil {
		gracePeriod = time.Duration(*s) * time.Second
	}
	for _, c := range pod.Spec.Containers {
		env, err := containerEnv(c.Env, c.EnvFrom, configMaps, secrets)
		if err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		out := Container{Env: env, ScrapePort: pod.Metadata.Annotations["prometheus.io/port"], GracePeriod: gracePeriod}
		if err := c.fill(&out); err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		m.Containers[c.Name] = out
	}
	return nil
}

// fill sets out's fields that c alone gives: its ports, probes, preStop
// sleep and memory.
func (c podContainer) fill(out *Container) (err error) {
	out.PreStopSleep = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	if out.MemoryRequest, err = quantity(c.Resources.Requests.Memory); err != nil {
		return fmt.Errorf("resources.requests.memory: %w", err)
	}
	if out.MemoryLimit, err = quantity(c.Resources.Limits.Memory); err != nil {
		return fmt.Errorf("resources.limits.memory: %w", err)
	}
	for _, p := range c.Ports {
		out.Ports = append(out.Ports, p.ContainerPort)
	}
	out.Probes = map[string]Probe{}
	for kind, p := range map[string]*httpProbe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		if p != nil {
			out.Probes[kind] = Probe{Path: p.HTTPGet.Path, Port: p.HTTPGet.Port}
		}
	}
	return nil
}

// quantity reads a Kubernetes memory quantity (64Mi, 1Gi, 500M, 1000) as
// bytes; "" is 0 (left out). The forms this file could use, not all of
// Kubernetes' (no exponents or fractions).
func quantity(q string) (int64, error) {
	if q == "" {
		return 0, nil
	}
	for _, unit := range []struct {
		suffix string
		factor int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"", 1}} {
		if n, ok := strings.CutSuffix(q, unit.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil || v < 0 {
				break
			}
			return v * unit.factor, nil
		}
	}
	return 0, fmt.Errorf("%q is no quantity this reader knows", q)
}

// addPolicy records the ports a NetworkPolicy lets in, for each app its pod
// selector names (matchLabels app, or matchExpressions app In).
func (m *Manifest) addPolicy(d object) error {
	var p struct {
		Spec struct {
			PodSelector struct {
				MatchLabels      map[string]string `yaml:"matchLabels"`
				MatchExpressions []struct {
					Key, Operator string
					Values        []string
				} `yaml:"matchExpressions"`
			} `yaml:"podSelector"`
			Ingress []struct {
				Ports []struct{ Port int }
			}
		}
	}
	if err := d.node.Decode(&p); err != nil {
		return err
	}
	var apps []string
	if app, ok := p.Spec.PodSelector.MatchLabels["app"]; ok {
		apps = append(apps, app)
	}
	for _, e := range p.Spec.PodSelector.MatchExpressions {
		if e.Key == "app" && e.Operator == "In" {
			apps = append(apps, e.Values...)
		}
	}
	for _, rule := range p.Spec.Ingress {
		for _, port := range rule.Ports {
			for _, app := range apps {
				m.PolicyPorts[app] = append(m.PolicyPorts[app], port.Port)
			}
		}
	}
	return nil
}

// Port is the port of a listening address such as 0.0.0.0:8080, or -1.
func Port(hostport string) int {
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return -1
	}
	return n
}
