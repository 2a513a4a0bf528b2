"""Your SSH public keys (marketplace/ssh_keys.py), which leases with `ssh` get.

- GET /api/v1/ssh-keys/: {"results": [{id, name, type, fingerprint, created_at}]},
  oldest first (at most ssh_keys.MAX_KEYS: not paginated).
- POST /api/v1/ssh-keys/ {"name", "public_key"}: 201 with the same item; a key that is
  not one accepted OpenSSH public key line is a 400 naming `public_key` and the problem.
- DELETE /api/v1/ssh-keys/<id>/: 204; another user's or a missing id is a 404.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import StrictCharField, StrictInputSerializer
from marketplace import ssh_keys
from marketplace.models import SshKey


class SshKeyOut(serializers.ModelSerializer):
    type = serializers.CharField(source="key_type", help_text='e.g. "ssh-ed25519"')

    class Meta:
        model = SshKey
        fields = ["id", "name", "type", "fingerprint", "created_at"]


class SshKeysOut(serializers.Serializer):
    results = SshKeyOut(many=True)


class SshKeyIn(StrictInputSerializer):
    # the length, NUL and control-character rules are ssh_keys' (one message each)
    name = StrictCharField(required=False, allow_blank=True, max_length=1000,
                           trim_whitespace=False)
    public_key = StrictCharField(allow_blank=True, max_length=ssh_keys.MAX_KEY_CHARS * 4,
                                 trim_whitespace=False,
                                 help_text="one OpenSSH public key line: `ssh-ed25519 AAAA… "
                                           "[comment]` (ed25519, ECDSA, RSA ≥ 2048 bits)")


class SshKeyList(APIView):
    """List or add your SSH public keys."""

    @extend_schema(responses=SshKeysOut)
    def get(self, request):
        keys = SshKey.objects.filter(owner=request.user)
        return Response({"results": SshKeyOut(keys, many=True).data})

    @extend_schema(request=SshKeyIn, responses={201: SshKeyOut})
    def post(self, request):
        data = SshKeyIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        key = ssh_keys.add_key(owner_id=request.user.pk, public_key=v["public_key"],
                               name=v.get("name"))
        return Response(SshKeyOut(key).data, status=201)


class SshKeyDelete(APIView):
    """Delete one of your SSH keys: the next lease no longer gets it."""

    @extend_schema(request=None, responses={204: None})
    def delete(self, request, pk: int):
        ssh_keys.delete_key(owner_id=request.user.pk, key_id=pk)
        return Response(status=204)
