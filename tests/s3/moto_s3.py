"""A real S3 API on 127.0.0.1 for tests/s3: moto's server, run by .venv-s3's interpreter (`make
s3`; s3fs and moto cannot live in the main virtualenv: python-dateutil). Not a test module.

    .venv-s3/bin/python tests/s3/moto_s3.py FOLDER BUCKET PREFIX

starts the server on a free port with authentication on (every request after the first six,
which make two users, their policies and access keys, must be signed with a key), uploads
FOLDER to s3://BUCKET/PREFIX/ through s3fs, prints one JSON line {"endpoint", "key", "secret",
"meta_only": [key, secret]} (the second user may read the meta.json files only) and serves
until its stdin closes (the test ends)."""

import json
import logging
import os
import sys

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "6"  # read by moto.settings at import: the IAM calls below

import boto3  # noqa: E402
import s3fs  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402


def main(folder: str, bucket: str, prefix: str) -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on the test's stderr
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = "http://%s:%d" % server.get_host_and_port()
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="setup", aws_secret_access_key="setup")
    keys = {}
    for user, resource in (("trainer", "*"), ("meta-only", f"arn:aws:s3:::{bucket}/{prefix}/*/meta.json")):
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="read", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": resource}]}))
        keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
    key = keys["trainer"]
    fs = s3fs.S3FileSystem(key=key["AccessKeyId"], secret=key["SecretAccessKey"], endpoint_url=endpoint)
    fs.mkdir(bucket)
    fs.put(folder.rstrip("/") + "/", f"{bucket}/{prefix}/", recursive=True)
    meta_only = keys["meta-only"]
    print(json.dumps({"endpoint": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
                      "meta_only": [meta_only["AccessKeyId"], meta_only["SecretAccessKey"]]}), flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
