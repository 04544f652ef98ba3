#!/bin/bash
# A router's first boot (cloud-init runs this once): the edgeinfer wheel and the model store from S3, and
# a systemd service that fetches the IoT certificate from Secrets Manager into a runtime folder only the
# service user can read (deleted when the service stops), then runs the router. CloudFormation's Fn::Sub
# fills the braced names; the shell's own variables go without braces so that Fn::Sub leaves them.
set -euo pipefail

dnf install -y python3.11
useradd --system --home-dir /opt/edgeinfer --shell /sbin/nologin edgeinfer
install -d -o edgeinfer -g edgeinfer /opt/edgeinfer /opt/edgeinfer/model
python3.11 -m venv /opt/edgeinfer/venv
wheel=/opt/edgeinfer/$(basename "${RouterWheelKey}")
aws s3 cp --only-show-errors "s3://${ArtifactBucket}/${RouterWheelKey}" "$wheel"
/opt/edgeinfer/venv/bin/pip install --quiet "$wheel[cloud,${Extra}]"
aws s3 sync --only-show-errors "s3://${ArtifactBucket}/${ModelPrefix}" /opt/edgeinfer/model

token=$(curl -sS -X PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')
instance=$(curl -sS -H "X-aws-ec2-metadata-token: $token" http://169.254.169.254/latest/meta-data/instance-id)

cat > /opt/edgeinfer/credentials.sh <<'SCRIPT'
#!/bin/bash
# The certificate lives only in Secrets Manager and, while the router runs, in its runtime folder.
set -euo pipefail
umask 077
aws secretsmanager get-secret-value --region ${AWS::Region} --secret-id '${RouterCertificateSecretArn}' \
    --query SecretString --output text \
  | /opt/edgeinfer/venv/bin/python -c '
import json, pathlib, sys
secret, folder = json.load(sys.stdin), pathlib.Path(sys.argv[1])
(folder / "router.pem.crt").write_text(secret["certificatePem"])
(folder / "router.pem.key").write_text(secret["privateKey"])
' "$RUNTIME_DIRECTORY"
SCRIPT
chmod 0755 /opt/edgeinfer/credentials.sh

cat > /etc/systemd/system/edgeinfer-router.service <<UNIT
[Unit]
Description=edgeinfer cloud router of fleet ${FleetName}
Wants=network-online.target
After=network-online.target

[Service]
User=edgeinfer
RuntimeDirectory=edgeinfer
RuntimeDirectoryMode=0700
ExecStartPre=/opt/edgeinfer/credentials.sh
ExecStart=/opt/edgeinfer/venv/bin/edgeinfer cloud router \
  --endpoint ${IotEndpoint} --cert %t/edgeinfer/router.pem.crt --key %t/edgeinfer/router.pem.key \
  --client-id ${FleetName}-router-$instance --group ${RouterGroup} --connections ${ConnectionsPerRouter} \
  --model-dir /opt/edgeinfer/model --providers ${Providers} \
  --cloudwatch --fleet ${FleetName} --region ${AWS::Region}
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable --now edgeinfer-router.service
