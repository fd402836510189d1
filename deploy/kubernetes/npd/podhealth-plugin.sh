#!/bin/bash
# node-problem-detector custom plugin: the local podhealth agent's verdict as a node condition.
# NPD's plugin protocol: exit 0 = OK, 1 = NonOK, anything else = Unknown; the first line of stdout
# (cut to max_output_length) is the condition message. Pure bash (/dev/tcp): NPD's image has no curl.
host=${PODHEALTH_HOST:-${HOST_IP:-127.0.0.1}}
port=${PODHEALTH_PORT:-9410}
if ! exec 3<>"/dev/tcp/${host}/${port}" 2>/dev/null; then
  echo "podhealth agent not reachable at ${host}:${port}"
  exit 2
fi
printf 'GET /health HTTP/1.0\r\nHost: %s\r\nAccept: application/json\r\nConnection: close\r\n\r\n' "$host" >&3
body=""
while IFS= read -r -t 4 line <&3; do body+="$line"; done
body+="$line"
exec 3<&-
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
