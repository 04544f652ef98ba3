"""The router fleet on AWS: a CloudFormation template (`template`) of an Auto Scaling group of routers
scaled on their own CloudWatch metric, its parameters (`parameters`, the one table the template, the
renderer and docs/fleet.md read) and `edgeinfer cloud fleet-template` (`cli`) that renders it."""
