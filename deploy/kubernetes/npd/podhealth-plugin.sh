#!/bin/bash
# node-problem-detector custom plugin: the local podhealth agent's verdict as a node condition.
# NPD's plugin protocol: exit 0 = OK, 1 = NonOK, anything else = Unknown; the first line of stdout
# (cut to max_output_length) is the condition message. Pure bash (/dev/tcp) plus sha256sum: NPD's
# image has no curl, no python.
#
# The verdict counts only when the agent proves it with the node's agent key (docs/security.md):
# a fresh nonce goes with the request, and the answer's X-Podhealth-Proof must be
# HMAC-SHA256(key, "podhealth-answer-v1" \n node \n GET \n /health \n nonce \n time \n status \n
# sha256(body)). Whatever else holds the agent's port is Unknown. The HMAC is built from sha256sum
# with the key fed on stdin, never on a command line that `ps` shows other users.
#   NODE_NAME (spec.nodeName) or PODHEALTH_NODE: this node's name;
#   PODHEALTH_KEY_FILE: the agent key, default /host/etc/podhealth/agent-token (mount the host's
#   /etc/podhealth read-only, as the agent's DaemonSet does).
export LC_ALL=C
host=${PODHEALTH_HOST:-${HOST_IP:-127.0.0.1}}
port=${PODHEALTH_PORT:-9410}
node=${PODHEALTH_NODE:-${NODE_NAME:-}}
key_file=${PODHEALTH_KEY_FILE:-/host/etc/podhealth/agent-token}

unknown() { echo "$1"; exit 2; }

[[ -n $node ]] || unknown "podhealth: no node name (NODE_NAME): cannot check the agent's proof"
key=""
{ IFS= read -r key || [[ -n $key ]]; } < "$key_file" 2>/dev/null
key=${key%%[[:space:]]*}
[[ -n $key ]] || unknown "podhealth: no agent key in ${key_file}: cannot tell the agent from an impostor"
command -v sha256sum >/dev/null || unknown "podhealth: sha256sum missing: cannot check the agent's proof"

# Hex digits as \xHH escapes (for printf), and the hex sha256 of stdin.
esc_of_hex() { local h=$1 i out=""; for ((i = 0; i < ${#h}; i += 2)); do out+="\\x${h:i:2}"; done; printf '%s' "$out"; }
sha256_hex() { sha256sum | { read -r h _; printf '%s' "$h"; }; }

# HMAC-SHA256(key, message) per RFC 2104: key bytes (hashed if over 64), zero-padded to 64.
hmac_sha256() {
  local msg=$1 khex="" i b ipad="" opad="" inner
  if ((${#key} > 64)); then khex=$(printf '%s' "$key" | sha256_hex); else
    for ((i = 0; i < ${#key}; i++)); do printf -v khex '%s%02x' "$khex" "'${key:i:1}"; done
  fi
  for ((i = 0; i < 64; i++)); do
    b=${khex:i*2:2}; b=$((16#${b:-00}))
    printf -v ipad '%s\\x%02x' "$ipad" $((b ^ 0x36))
    printf -v opad '%s\\x%02x' "$opad" $((b ^ 0x5c))
  done
  inner=$( { printf "$ipad"; printf '%s' "$msg"; } | sha256_hex)
  { printf "$opad"; printf "$(esc_of_hex "$inner")"; } | sha256_hex
}

nonce=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
[[ ${#nonce} == 32 ]] || unknown "podhealth: no random nonce (/dev/urandom)"
if ! exec 3<>"/dev/tcp/${host}/${port}" 2>/dev/null; then
  echo "podhealth agent not reachable at ${host}:${port}"
  exit 2
fi
printf 'GET /health HTTP/1.0\r\nHost: %s\r\nAccept: application/json\r\nX-Podhealth-Node: %s\r\nX-Podhealth-Nonce: %s\r\nConnection: close\r\n\r\n' \
  "$host" "$node" "$nonce" >&3
resp=""
IFS= read -r -d '' -t 4 resp <&3
rc=$?
exec 3<&-
((rc > 128)) && unknown "podhealth agent at ${host}:${port} did not answer within 4s"
head=${resp%%$'\r\n\r\n'*}
body=${resp#*$'\r\n\r\n'}
[[ $head != "$resp" ]] || unknown "podhealth agent at ${host}:${port} sent no HTTP answer"
read -r _ code _ <<<"${head%%$'\r'*}"
proof="" ts=""
while IFS= read -r line; do
  line=${line%$'\r'}
  case "${line,,}" in
    x-podhealth-proof:*) proof=${line#*:}; proof=${proof// /} ;;
    x-podhealth-time:*) ts=${line#*:}; ts=${ts// /} ;;
  esac
done <<<"$head"
[[ -n $proof && $ts =~ ^[0-9]+$ ]] || unknown "podhealth: the answer on ${host}:${port} carries no proof: not this node's agent"
digest=$(printf '%s' "$body" | sha256_hex)
want=$(hmac_sha256 "podhealth-answer-v1"$'\n'"${node}"$'\n'"GET"$'\n'"/health"$'\n'"${nonce}"$'\n'"${ts}"$'\n'"${code}"$'\n'"${digest}")
[[ ${proof,,} == "$want" ]] || unknown "podhealth: the answer on ${host}:${port} is not proven by ${node}'s key"

# The node's own verdict is the first "status" in the body (it precedes the per-check results).
re_status='"status": *"([A-Z]+)"'
re_action='"action": *"([A-Z_]+)"'
if [[ ! $body =~ $re_status ]]; then
  echo "podhealth agent at ${host}:${port} sent no verdict"
  exit 2
fi
status=${BASH_REMATCH[1]}
action=NONE
[[ $body =~ $re_action ]] && action=${BASH_REMATCH[1]}
case "$status" in
  OK|WARN) echo "podhealth: node is ${status}"; exit 0 ;;
  FAIL) echo "podhealth: node FAIL, action ${action}"; exit 1 ;;
  *) echo "podhealth: node verdict ${status}"; exit 2 ;;
esac
