#!/usr/bin/env bash
# Prints config/default with the manager image set to $1 (make render,
# deploy, undeploy). kubectl's built-in kustomize cannot edit a
# kustomization, so this builds a throwaway overlay under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
img=${1:?usage: render.sh IMAGE}
dir=$(mktemp -d "${PWD}/target/render.XXXXXX" 2>/dev/null || { mkdir -p target; mktemp -d "${PWD}/target/render.XXXXXX"; })
trap 'rm -rf "$dir"' EXIT
# Split the tag off after the last "/", so registry ports (host:5000/x) stay.
name=$img tag=
last=${img##*/}
case $last in
  *@*) name=${img%@*}; tag=; digest=${img##*@} ;;
  *:*) name=${img%:*}; tag=${img##*:} ;;
  *) tag=latest ;;  # as docker reads an image without a tag
esac
{
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources:"
  echo "- ../../config/default"
  echo "images:"
  echo "- name: example.com/egress-proxies-operator"
  echo "  newName: $name"
  if [ -n "${digest:-}" ]; then echo "  digest: $digest"; elif [ -n "$tag" ]; then echo "  newTag: \"$tag\""; fi
} >"$dir/kustomization.yaml"
"${KUBECTL:-kubectl}" kustomize "$dir"
