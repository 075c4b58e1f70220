"""A real S3 API on 127.0.0.1 for tests/s3: moto's server, run by .venv-s3's interpreter (`make
s3`; s3fs and moto cannot live in the main virtualenv: python-dateutil). Not a test module.

    .venv-s3/bin/python tests/s3/moto_s3.py FOLDER BUCKET PREFIX

starts the server on a free port with authentication on (every request after the first three,
which make a user, its policy and its access key, must be signed with that key), uploads
FOLDER to s3://BUCKET/PREFIX/ through s3fs, prints one JSON line {"endpoint", "key", "secret"}
and serves until its stdin closes (the test ends)."""

import json
import logging
import os
import sys

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"  # read by moto.settings at import: the IAM calls below

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
    iam.create_user(UserName="trainer")
    iam.put_user_policy(UserName="trainer", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="trainer")["AccessKey"]
    fs = s3fs.S3FileSystem(key=key["AccessKeyId"], secret=key["SecretAccessKey"], endpoint_url=endpoint)
    fs.mkdir(bucket)
    fs.put(folder.rstrip("/") + "/", f"{bucket}/{prefix}/", recursive=True)
    print(json.dumps({"endpoint": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}), flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
