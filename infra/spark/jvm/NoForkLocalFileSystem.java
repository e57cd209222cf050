package fraud.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system (``file:``), setting permissions through java.nio.
 *
 * <p>Without Hadoop's native library, RawLocalFileSystem forks {@code chmod} for every file it creates,
 * and the checksum layer creates two files per write: every offset-log and commit-log entry and every
 * state store's changelog costs two process launches from the Spark JVM. Here the same permissions
 * are set with one system call.
 */
public class NoForkLocalFileSystem extends LocalFileSystem {
  public NoForkLocalFileSystem() {
    super(new NioPermissionsRawLocalFileSystem());
  }

  /** RawLocalFileSystem whose setPermission is chmod(2) through java.nio. */
  public static class NioPermissionsRawLocalFileSystem extends RawLocalFileSystem {
    /** The permission bits of a Unix mode, lowest first (others execute ... owner read). */
    private static final PosixFilePermission[] MODE_BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < MODE_BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          bits.add(MODE_BITS[bit]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(path).toPath(), bits);
    }
  }
}
