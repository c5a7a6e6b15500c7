# The KubeRay operator, from a binary built elsewhere (tests/k8s/build/build.sh builds
# github.com/ray-project/kuberay/ray-operator, CGO off: static), so no base image.
# tests/k8s/images/build.py stages the context (`kuberay-operator`) and tags it as the
# chart's values.yaml expects by default (image.repository:image.tag), so the chart's
# Deployment (command: operatorCommand, /manager) runs it. Like upstream's image: the
# binary at /manager and a numeric non-root user (the chart sets runAsNonRoot: true).
FROM scratch
COPY kuberay-operator /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
