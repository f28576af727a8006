"""Name server: topic routes, topic and group config, broker liveness as clients see it. Stateless: etcd is the truth; each instance watches etcd and serves a cache over HTTP."""
